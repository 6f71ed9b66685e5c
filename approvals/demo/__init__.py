"""The demo MCP server (protocol revision 2026-07-28, and the handshake era on a session), built on the
official `mcp` SDK.

A standalone process, independent of Django: `python -m approvals.demo --host 127.0.0.1 --port 8765`
serves Streamable HTTP at `/mcp`. Environment:

- `ELICIT_DEMO_STATE_KEY`: the key sealing `requestState` (a fixed development key when unset).
- `ELICIT_DEMO_STATE_TTL`: how long a round's state stays valid, in seconds (default 600).
- `ELICIT_DEMO_TEST_HOOKS=1`: mount the JSON test hooks under `/test-hooks/` (see `hooks`).
"""
