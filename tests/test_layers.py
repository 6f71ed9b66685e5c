"""The one-way layers: views / api / consumers / tasks -> services -> the core modules -> models, never back.

A walk over the source (every import, at module level or inside a function), no Django needed. See
docs/architecture.md for what each layer holds.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from approvals import queueing

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "approvals"

# Below the services: what they build on. Each may import models and the others here, never upwards.
CORE = (
    "approvals.audit.core",
    "approvals.audit.verbs",
    "approvals.audit.verify",
    "approvals.broadcast",
    "approvals.canonical",
    "approvals.cards",
    "approvals.channel_layer",
    "approvals.faults",
    "approvals.mcp_client",
    "approvals.netguard",
    "approvals.permissions",
    "approvals.prepared",
    "approvals.queueing",
    "approvals.redis_cache",
    "approvals.rules",
    "approvals.safejson",
    "approvals.schema_forms",
    "approvals.selectors",
    "approvals.urlparts",
    "approvals.urlsafety",
    "approvals.visible",
)
SERVICES = ("approvals.services",)
MODELS = ("approvals.models",)


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


def layer(module: str) -> int:
    """0 models, 1 core, 2 services, 3 everything that uses them (views, api, consumers, tasks, commands)."""
    if _within(module, MODELS):
        return 0
    if _within(module, CORE):
        return 1
    if _within(module, SERVICES):
        return 2
    return 3


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(name: str, root: Path = ROOT) -> bool:
    base = root.joinpath(*name.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def imports(path: Path, root: Path = ROOT) -> Iterator[tuple[int, str]]:
    """(line, module) for every project module the file imports, wherever the import statement is."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                # ``from approvals import tasks`` imports the module approvals.tasks.
                name = f"{node.module}.{alias.name}"
                yield node.lineno, name if is_module(name, root) else node.module


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        if "migrations" not in path.parts:
            graph[module_name(path, root)] = {target for _, target in imports(path, root)}
    return graph


def backward_arrows(root: Path = ROOT) -> list[str]:
    """Every import of a module in a higher layer, and any import of the project by the models."""
    found = []
    for path in sorted((root / PACKAGE).rglob("*.py")):
        if "migrations" in path.parts:
            continue
        source = module_name(path, root)
        for line, target in imports(path, root):
            if target == source or _within(target, (source,)):
                continue
            if layer(target) > layer(source) or (layer(source) == 0 and layer(target) == 0):
                found.append(f"{path.relative_to(root)}:{line}: {source} imports {target}")
    return found


def cycle(graph: dict[str, set[str]], within: tuple[str, ...]) -> list[str]:
    """One import cycle among the modules ``within`` names, or []."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if not _within(target, within) or target == node:
                continue
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if _within(node, within) and node not in state and (found := visit(node)):
            return found
    return []


def test_no_import_points_back_up_the_layers() -> None:
    assert backward_arrows() == []


def test_no_module_imports_itself_through_others() -> None:
    """No import cycles anywhere (the services among themselves included), function-level imports too."""
    assert cycle(import_graph(), (PACKAGE,)) == []


def test_the_walk_sees_an_arrow_pointing_back_up_and_a_cycle(tmp_path: Path) -> None:
    """The checks themselves, on a small tree: a service importing the tasks inside a function, and two
    services importing each other."""
    services = tmp_path / PACKAGE / "services"
    services.mkdir(parents=True)
    for init in (tmp_path / PACKAGE / "__init__.py", services / "__init__.py"):
        init.write_text("")
    (services / "a.py").write_text(
        "from approvals.models import X\n\n\ndef f():\n    from approvals import tasks\n"
    )
    (services / "b.py").write_text("from approvals.services import c\n")
    (services / "c.py").write_text("def g():\n    from approvals.services.b import h\n")
    (tmp_path / PACKAGE / "tasks.py").write_text("from approvals.services import a\n")
    (tmp_path / PACKAGE / "models.py").write_text("from approvals import selectors\n")
    (tmp_path / PACKAGE / "selectors.py").write_text("from approvals import models\n")

    assert backward_arrows(tmp_path) == [
        "approvals/models.py:1: approvals.models imports approvals.selectors",
        "approvals/services/a.py:5: approvals.services.a imports approvals.tasks",
    ]
    graph = import_graph(tmp_path)
    assert cycle(graph, SERVICES) == ["approvals.services.b", "approvals.services.c", "approvals.services.b"]
    assert cycle(graph, ("approvals.tasks",)) == []


FORMER_NAMES = [
    "approvals.tasks.resume_call",
    "approvals.tasks.escalate_due",
    "approvals.audit_tasks.verify_chain",
]


@pytest.mark.parametrize("name", [*queueing.TASKS, *FORMER_NAMES])
def test_every_task_name_queued_is_registered(name: str) -> None:
    """What services queue by name, and names a running deployment may still hold in its queue."""
    from elicit_hub.celery import app

    app.loader.import_default_modules()
    assert name in app.tasks


def test_beat_runs_registered_tasks() -> None:
    from django.conf import settings

    from elicit_hub.celery import app

    app.loader.import_default_modules()
    assert {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()} <= set(app.tasks)
