"""The launcher's process list: N web processes, M workers, K holders (pure logic, nothing started)."""

from __future__ import annotations

import pytest

from elicit_hub.launch import Layout, commands, parse_layout, procfile


def test_one_of_each_by_default_on_the_usual_ports() -> None:
    layout, only_print = parse_layout([], {})
    assert not only_print
    procs = commands(layout, "py")
    assert sorted(procs) == ["api", "demo", "gateway", "holder", "web", "worker"]
    assert procs["web"][-3:] == ["-p", "8000", "elicit_hub.asgi:application"]
    assert procs["gateway"][-1] == "8001"
    assert procs["api"] == ["py", "-m", "elicit_hub.serve_api", "--host", "127.0.0.1", "--port", "8002"]
    assert "--beat" in procs["worker"]


def test_more_processes_listen_on_consecutive_ports_and_beat_runs_once() -> None:
    layout, _ = parse_layout(["--web", "3", "--workers", "2", "--holders", "2"], {"PORT": "9000"})
    procs = commands(layout, "py")
    assert [procs[f"web{i}"][procs[f"web{i}"].index("-p") + 1] for i in (1, 2, 3)] == [
        "9000",
        "9001",
        "9002",
    ]
    assert procs["gateway"][-1] == "9003"  # after the last web process
    assert procs["api"][-1] == "9004"  # after the last gateway
    assert [name for name in procs if name.startswith("holder")] == ["holder1", "holder2"]
    workers = [procs["worker1"], procs["worker2"]]
    assert ["--beat" in w for w in workers] == [True, False]
    assert [w[w.index("-n") + 1] for w in workers] == ["worker1@%h", "worker2@%h"]  # distinct node names


def test_the_environment_sets_the_counts_and_the_command_line_wins() -> None:
    env = {"ELICIT_WEB": "2", "ELICIT_WORKERS": "3", "ELICIT_HOLDERS": "0", "ELICIT_GATEWAY_PORT": "7000"}
    layout, _ = parse_layout(["--workers", "1"], env)
    assert (layout.web, layout.workers, layout.holders) == (2, 1, 0)
    assert layout.gateway_ports == [7000]
    assert not any(name.startswith("holder") for name in commands(layout, "py"))


def test_api_servers_take_the_ports_after_the_gateways_or_their_own_and_none_is_allowed() -> None:
    layout, _ = parse_layout(["--api", "2"], {"ELICIT_GATEWAYS": "2"})
    procs = commands(layout, "py")
    assert [procs[name][-1] for name in ("api1", "api2")] == ["8003", "8004"]
    layout, _ = parse_layout([], {"ELICIT_API": "2", "ELICIT_API_PORT": "9100"})
    assert layout.api_ports == [9100, 9101]
    layout, _ = parse_layout(["--api", "0"], {})
    assert not any(name.startswith("api") for name in commands(layout, "py"))


def test_a_procfile_line_per_process() -> None:
    text = procfile(Layout(web=2), "py")
    assert (
        text.splitlines()[0]
        == "web1: py -m elicit_hub.serve -b 127.0.0.1 -p 8000 elicit_hub.asgi:application"
    )
    assert "worker: py -m celery -A elicit_hub worker" in text


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--web", "0"], {}, "--web must be between 1 and 32"),
        (["--workers", "two"], {}, "not a whole number"),
        ([], {"ELICIT_HOLDERS": "many"}, "not a whole number: 'many'"),
        ([], {"ELICIT_GATEWAY_PORT": "8001"}, "overlap the web ports"),
        ([], {"ELICIT_API_PORT": "8001"}, "API ports overlap the web or gateway ports"),
        (["--api", "33"], {}, "--api must be between 0 and 32"),
        (["--web", "2", "--port", "65535"], {}, "ports must lie between"),
    ],
)
def test_bad_counts_and_ports_are_refused_with_a_clear_message(
    argv: list[str], env: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_layout(argv, {"ELICIT_WEB": "2", **env} if "ELICIT_GATEWAY_PORT" in env else env)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
