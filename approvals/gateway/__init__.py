"""The hub as an MCP server for agents: see approvals.gateway.server."""
