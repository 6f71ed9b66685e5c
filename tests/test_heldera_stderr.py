"""A stdio server's stderr line cut short in the log must not end in the first part of its credential.

Real parts: an OS pipe written as a server writes its stderr (in pieces, as a process that flushes mid-line
does), read by the supervisor's stderr pump into the log.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest

from approvals.holder import stdio as stdio_holder
from approvals.holder.stdio import StdioSupervisor, env_secrets

pytestmark = pytest.mark.anyio

SECRET = "sk-" + "".join(f"{n:02x}" for n in range(100))  # one word of 203 characters


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _write_in_pieces(fd: int, *pieces: bytes) -> None:
    with os.fdopen(fd, "wb", buffering=0) as pipe:
        for piece in pieces:
            pipe.write(piece)
            time.sleep(0.3)


async def test_a_credential_that_a_long_stderr_lines_cut_goes_through_is_not_logged_in_part(
    caplog: pytest.LogCaptureFixture,
) -> None:
    head = b"x" * (stdio_holder.MAX_STDERR_LINE - 96)
    read_fd, write_fd = os.pipe()
    writer = threading.Thread(
        target=_write_in_pieces,
        args=(write_fd, head + SECRET[:100].encode(), SECRET[100:].encode() + b" and more\nnext line\n"),
    )
    writer.start()
    with caplog.at_level(logging.INFO, logger="approvals.stdio.cut"):
        await StdioSupervisor(0, "h")._pump_stderr(read_fd, "cut", env_secrets({"API_KEY": SECRET}))
    writer.join()
    logged = [r.getMessage() for r in caplog.records if r.name == "approvals.stdio.cut"]
    assert logged[-1] == "next line"
    assert logged[0].startswith("x" * 100) and logged[0].endswith(" [cut]")
    assert not any(SECRET[:8] in line for line in logged), logged[0][-120:]
    assert "[redacted]" in logged[0]


async def test_the_secret_inside_a_json_or_connection_string_credential_is_replaced_when_logged_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {
        "GOOGLE_CREDENTIALS": '{"type":"service_account","client_secret":"GOCSPX-9f8e7d6c5b4a"}',
        "DATABASE_URL": "postgres://app:pa55w0rd1234@db.internal/app",
    }
    read_fd, write_fd = os.pipe()
    writer = threading.Thread(
        target=_write_in_pieces,
        args=(write_fd, b"using secret GOCSPX-9f8e7d6c5b4a\nlogin failed for pa55w0rd1234\n"),
    )
    writer.start()
    with caplog.at_level(logging.INFO, logger="approvals.stdio.creds"):
        await StdioSupervisor(0, "h")._pump_stderr(read_fd, "creds", env_secrets(env))
    writer.join()
    logged = [r.getMessage() for r in caplog.records if r.name == "approvals.stdio.creds"]
    assert logged == ["using secret [redacted]", "login failed for [redacted]"]
