"""A stdio MCP server written by hand (raw JSON-RPC, no SDK), to misbehave as SDK servers never do.

    python tests/hld7_raw_server.py

Its environment variable ``BEHAVIOUR`` says how ``tools/call`` goes:

- ``twice``: answers the call, then answers the same request again (another result, the same id).
- ``ask_ids``: asks ``elicitation/create`` with odd ids (``null``, an object, a float, the id of the call
  itself), then answers the call ``done``.
- ``ask_same_id``: asks two questions at once under one id, then answers the call with what it got.
- ``changed_stall``: says its tools changed, then answers the call ``done``; every ``tools/list`` after
  that is never answered, and noted in the file ``stalled`` of its working directory.
Any other tool answers ``ok`` at once.
"""

from __future__ import annotations

import json
import os
import sys
import threading

BEHAVIOUR = os.environ.get("BEHAVIOUR", "")
out = threading.Lock()
answers: dict[str, list] = {}
waiting: dict[str, threading.Event] = {}
called = False  # a tools/call came


def send(message: dict) -> None:
    with out:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def result(ident, text: str) -> dict:
    return {"jsonrpc": "2.0", "id": ident, "result": {"content": [{"type": "text", "text": text}]}}


QUESTION = {
    "message": "Go?",
    "requestedSchema": {"type": "object", "properties": {"go": {"type": "boolean"}}},
}


def ask(ident) -> None:
    send({"jsonrpc": "2.0", "id": ident, "method": "elicitation/create", "params": QUESTION})


def wait_answers(key: str, count: int, timeout: float) -> list:
    event = waiting.setdefault(key, threading.Event())
    event.wait(timeout)
    return answers.get(key, [])


def call(ident, name: str) -> None:
    if name != "act":
        send(result(ident, "ok"))
    elif BEHAVIOUR == "twice":
        send(result(ident, "first"))
        send(result(ident, "second"))
    elif BEHAVIOUR == "changed_stall":
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        send(result(ident, "done"))
    elif BEHAVIOUR == "ask_ids":
        for odd in (None, {"x": 1}, 1.5, ident):
            ask(odd)
        send(result(ident, "done"))
    elif BEHAVIOUR == "ask_same_id":
        ask("q")
        ask("q")
        got = wait_answers("q", 2, 20)
        send(result(ident, json.dumps(got)))
    else:
        send(result(ident, "ok"))


for line in sys.stdin:
    message = json.loads(line)
    method, ident = message.get("method"), message.get("id")
    if method is None:  # an answer to one of our questions
        key = json.dumps(ident) if not isinstance(ident, str) else ident
        answers.setdefault(key, []).append(message.get("result") or message.get("error"))
        waiting.setdefault(key, threading.Event()).set()
    elif method == "initialize":
        send(
            {
                "jsonrpc": "2.0",
                "id": ident,
                "result": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "hld7-raw", "version": "1"},
                },
            }
        )
    elif method == "tools/list":
        if BEHAVIOUR == "changed_stall" and called:
            with open("stalled", "a") as noted:
                noted.write("x")
            continue
        tools = [{"name": n, "inputSchema": {"type": "object"}} for n in ("act", "echo")]
        send({"jsonrpc": "2.0", "id": ident, "result": {"tools": tools}})
    elif method == "tools/call":
        called = True
        threading.Thread(target=call, args=(ident, message["params"]["name"]), daemon=True).start()
    elif ident is not None:
        send({"jsonrpc": "2.0", "id": ident, "result": {}})
