"""The hub's MCP client: the only code in the project that speaks JSON-RPC / MCP.

Pure (no Django): Celery tasks pass it plain data. Protocol revision 2026-07-28 only.

    outcome = run(call_tool(server, "deploy", {"branch": "main"}, idempotency_key=key))
    # Completed | ToolError | InputRequired; failures raise TransientError / PermanentError
"""

from approvals.mcp_client.client import call_tool, discover, list_tools, run
from approvals.mcp_client.outcomes import (
    Completed,
    InputRequired,
    McpError,
    Outcome,
    PermanentError,
    ServerConfig,
    ToolError,
    TransientError,
    storable_text,
)
from approvals.mcp_client.wire import (
    PROTOCOL_VERSION,
    classify_rpc_error,
    invalid_header_reason,
    names_unknown_tool,
    param_headers,
    parse_retry_after,
    read_call_result,
)

__all__ = [
    "PROTOCOL_VERSION",
    "Completed",
    "InputRequired",
    "McpError",
    "Outcome",
    "PermanentError",
    "ServerConfig",
    "ToolError",
    "TransientError",
    "call_tool",
    "classify_rpc_error",
    "discover",
    "invalid_header_reason",
    "list_tools",
    "names_unknown_tool",
    "param_headers",
    "parse_retry_after",
    "read_call_result",
    "run",
    "storable_text",
]
