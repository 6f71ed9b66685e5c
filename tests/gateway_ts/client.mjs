// The official MCP TypeScript SDK client against the hub's gateway: lists the tools (every page, following
// nextCursor), calls one with a progress token, and prints one JSON line per event ({"tools", "pages"},
// {"progress"}, {"result"} or {"error"}).
// Usage: node client.mjs <url> <token> <tool> <arguments as JSON>
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, token, tool, args] = process.argv.slice(2);
const emit = (event) => process.stdout.write(JSON.stringify(event) + "\n");

const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: "gateway-ts-test", version: "1.0.0" });
try {
  await client.connect(transport);
  const tools = [];
  const cursors = new Set();
  let pages = 0;
  let cursor;
  do {
    const page = await client.listTools(cursor === undefined ? undefined : { cursor });
    tools.push(...page.tools);
    pages += 1;
    cursor = page.nextCursor;
    if (cursor !== undefined && cursors.has(cursor)) throw new Error("tools/list repeated a cursor");
    cursors.add(cursor);
  } while (cursor !== undefined && pages < 1000);
  emit({ tools: tools.map((t) => t.name), pages });
  const result = await client.callTool({ name: tool, arguments: JSON.parse(args) }, undefined, {
    onprogress: (p) => emit({ progress: p }),
    resetTimeoutOnProgress: true,
    timeout: 120000,
  });
  emit({ result });
} catch (error) {
  emit({ error: String(error) });
  process.exitCode = 1;
} finally {
  await client.close();
}
