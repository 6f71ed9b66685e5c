"""Sample arguments for the official MCP conformance suite's tools (used by `manage.py conformance_client`).

Pure: a value for each required property of a tool's inputSchema, following same-document ``$ref`` only
(a network ``$ref`` is never fetched).
"""

from __future__ import annotations

from typing import Any

_BY_TYPE: dict[str, Any] = {
    "string": "test",
    "integer": 1,
    "number": 1,
    "boolean": True,
    "array": [],
    "object": {},
    "null": None,
}


def resolve_local(schema: Any, root: dict[str, Any]) -> dict[str, Any]:
    for _ in range(10):
        if not (isinstance(schema, dict) and isinstance(schema.get("$ref"), str)):
            break
        ref = schema["$ref"]
        if not ref.startswith("#/"):
            return {}
        node: Any = root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            node = node.get(part, {}) if isinstance(node, dict) else {}
        schema = node
    return schema if isinstance(schema, dict) else {}


def sample_value(prop: Any, root: dict[str, Any]) -> Any:
    prop = resolve_local(prop, root)
    if "default" in prop:
        return prop["default"]
    if "const" in prop:
        return prop["const"]
    if isinstance(prop.get("enum"), list) and prop["enum"]:
        return prop["enum"][0]
    one_of = prop.get("oneOf")
    if isinstance(one_of, list) and one_of and isinstance(one_of[0], dict) and "const" in one_of[0]:
        return one_of[0]["const"]
    kind = prop.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    return _BY_TYPE.get(kind, "test") if isinstance(kind, str) else "test"


def sample_arguments(input_schema: Any) -> dict[str, Any]:
    schema = input_schema if isinstance(input_schema, dict) else {}
    props = schema.get("properties")
    if not isinstance(props, dict):
        props = {}
    required = schema.get("required")
    if not isinstance(required, list):
        required = []
    return {name: sample_value(props.get(name, {}), schema) for name in required}


def planned_calls(scenario: str, context: dict[str, Any], tools: list[dict]) -> list[tuple[str, dict]]:
    """Which tools a scenario expects to be called, with which arguments."""
    if scenario == "json-schema-ref-no-deref":
        return []  # list only: that server has no tools/call handler
    if scenario == "http-custom-headers" and isinstance(context.get("toolCalls"), list):
        return [(call["name"], call.get("arguments") or {}) for call in context["toolCalls"]]
    return [(tool["name"], sample_arguments(tool.get("inputSchema"))) for tool in tools]
