#!/usr/bin/env bash
# Start `make run` as a newcomer would, check the dashboard's login page and the demo MCP server answer over
# HTTP, then stop it with one Ctrl-C (SIGINT) and check everything went down.
set -euo pipefail
cd "$(dirname "$0")/.."
port=8000
log=$(mktemp)
setsid make run PORT=$port >"$log" 2>&1 &
pid=$!
cleanup() { kill -INT -- -$pid 2>/dev/null || true; sleep 5; kill -KILL -- -$pid 2>/dev/null || true; }
trap cleanup EXIT
# Any check that fails says which, with the end of make run's output, instead of ending the script silently.
fail() { echo "smoke test failed: $1"; echo "-- the end of make run's output:"; tail -60 "$log"; exit 1; }
trap 'fail "line $LINENO: $BASH_COMMAND"' ERR
ok=""
for _ in $(seq 1 180); do
    kill -0 $pid 2>/dev/null || fail "make run stopped before it served the login page"
    if curl -fsS "http://127.0.0.1:$port/accounts/login/" >/dev/null 2>&1 \
        && curl -sS -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:8765/mcp" \
            -H 'content-type: application/json' -H 'accept: application/json, text/event-stream' \
            -d '{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}' \
            | grep -q '^[24]'; then
        ok=1
        break
    fi
    sleep 2
done
[ -n "$ok" ] || fail "make run did not serve the login page and the demo server in time"
# The banner follows the gateway, the API server and the demo's registration (a manage.py command, several
# seconds on a busy machine), so it is waited for, not expected at once.
for _ in $(seq 1 120); do
    grep -q "Elicit Hub is up" "$log" && break
    kill -0 $pid 2>/dev/null || fail "make run stopped before its banner"
    sleep 1
done
grep -q "Elicit Hub is up" "$log" || fail "no \"Elicit Hub is up\" banner within two minutes of the login page"
# The MCP gateway beside Daphne: up, and /mcp refuses a request without an agent token.
for _ in $(seq 1 30); do curl -fsS "http://127.0.0.1:8001/healthz" >/dev/null 2>&1 && break; sleep 1; done
curl -fsS "http://127.0.0.1:8001/healthz" >/dev/null
[ "$(curl -sS -o /dev/null -w '%{http_code}' -X POST http://127.0.0.1:8001/mcp -d '{}')" = 401 ]
echo "make run: the MCP gateway answers"
# The API server (uvicorn) beside Daphne: the same API, JSON errors included.
for _ in $(seq 1 30); do curl -fsS "http://127.0.0.1:8002/accounts/login/" >/dev/null 2>&1 && break; sleep 1; done
curl -sS "http://127.0.0.1:8002/api/v1/inbox" | grep -q '"code"'
echo "make run: the API server answers"
grep -q "Demo login" "$log" || echo "(demo admin existed already)"
echo "make run: login page and demo MCP server answer"
kill -INT -- -$pid
for _ in $(seq 1 30); do kill -0 $pid 2>/dev/null || break; sleep 1; done
if kill -0 $pid 2>/dev/null; then fail "make run did not stop on Ctrl-C"; fi
trap - EXIT
echo "make run stopped cleanly"
