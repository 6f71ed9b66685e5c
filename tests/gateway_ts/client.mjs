// The official MCP TypeScript SDK client against the hub's gateway: lists the tools, calls one with a
// progress token, and prints one JSON line per event ({"tools"}, {"progress"}, {"result"} or {"error"}).
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
  const { tools } = await client.listTools();
  emit({ tools: tools.map((t) => t.name) });
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
