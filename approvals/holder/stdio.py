"""stdio servers: one supervisor per server a holder process runs.

    supervisor = StdioSupervisor(server.pk, holder.name)
    if await supervisor.start():                # False: another live holder runs this server
        async with supervisor.session() as (client, dispatcher):
            outcome = await call_on(client, dispatcher, hooks, "build", {...}, timeout=limit)
    await supervisor.stop()                      # ends the process, releases the lease

The supervisor
- holds the PostgreSQL lease (`McpServer.stdio_holder`, see `approvals.services.stdio`): exactly one holder
  runs each stdio server. It checks the lease is still its own every few seconds and stops the process
  the moment it is not (its heartbeat went stale and another holder took over, or an admin disabled it);
- starts the command (`bounded_stdio_client`: the SDK's `stdio_client` with a bounded reader of its stdout: a
  line over ``ELICIT_MAX_MCP_RESPONSE`` ends the session, one that is not JSON-RPC is dropped unquoted) in its
  own working directory ``<ELICIT_STDIO_DIR>/<slug>`` (mode 0700), with only the server's configured
  environment over a minimal PATH/HOME/USER (never the hub's environment, which holds the hub's secrets).
  When the hub runs as root the process runs as ``ELICIT_STDIO_USER`` (default ``nobody``) through
  ``setpriv``, without supplementary groups and with no-new-privileges; it is killed if the holder dies
  (parent-death signal);
- sends its stderr, line by line, to the log (logger ``approvals.stdio.<slug>``), never to reviewers, with
  the values of its configured environment (its credentials), and their long words, replaced;
- restarts it when it ends (a crash, or an exit of its own: its process exits, or its stdout closes; a
  server may close its stderr, or point it elsewhere, and go on running), with a backoff, and reads its
  registration again at every start, so an admin's edits apply on the next restart. What it forked and left
  in its process group is killed with it, however it ended (children that would hold its stdout open, so
  that its end went unseen, and run on orphaned);
- gives exclusive use of the open client to one call at a time. A stdio connection is one session: an
  ``elicitation/create`` that arrives on it names no call, so the hub could not tell which of two
  concurrent calls asked. Calls to one stdio server are therefore serialised, and the session's
  `Dispatcher` routes what arrives to the call running now. A call that ends without its answer (its limit
  passed, it was stopped) may leave its tool running, and what that tool asks later would reach the next call:
  the process is restarted before the next call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import pwd
import re
import shutil
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import anyio
import anyio.lowlevel
import mcp_types
from asgiref.sync import sync_to_async
from django.conf import settings
from mcp import Client
from mcp.client import stdio as sdk_stdio
from mcp.client.stdio import StdioServerParameters
from mcp.shared.message import SessionMessage

from approvals import netguard
from approvals.mcp_client.outcomes import REDACTED, McpError, TransientError
from approvals.mcp_client.probe import probe_open
from approvals.mcp_client.session import Dispatcher, Mode, list_tools_on, open_client
from approvals.models import McpServer
from approvals.services import servers as servers_service
from approvals.services import stdio as stdio_service

logger = logging.getLogger(__name__)

# The PATH a stdio server gets (after the directory of its own command), unless its environment sets one.
MINIMAL_PATH = "/usr/local/bin:/usr/bin:/bin"
MAX_STDERR_LINE = 4096
# A server's stderr in the log: this many lines at once, then this many a second; the rest are counted.
STDERR_BURST = 1000
STDERR_RATE = 20
BACKOFF_MIN = 1.0
BACKOFF_MAX = 60.0
# A process that ran this long before it ended was not crash-looping: the backoff starts again.
STABLE_AFTER = 60.0
LEASE_CHECK_EVERY = 5.0
# Why a process is ended after a call that ended without its answer (not a crash: no backoff grows from it).
LEFT_RUNNING = "a call ended without its answer; its tool may still run"
# How often a stdio server's process is checked for its exit, and how long, once it exited and what it left in
# its process group was killed, its stdout may still stay open (held by a descendant that left the group).
EXIT_CHECK_EVERY = 0.25
ORPHAN_GRACE = 2.0
# Between calls, a server's notifications/tools/list_changed are answered with at most one listing this often
# (the notices that come meanwhile make one more listing, at the end of the interval): each listing is stored
# and audited, and a server may send such notices without end.
RELIST_EVERY = 5.0


@dataclass(frozen=True)
class RunAs:
    """The unprivileged user a stdio server runs as (None when the hub itself is not root)."""

    name: str
    uid: int
    gid: int

    @classmethod
    def configured(cls) -> RunAs | None:
        if os.geteuid() != 0:
            return None
        name = settings.ELICIT_STDIO_USER
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise RuntimeError(
                f"ELICIT_STDIO_USER names {name!r}, which is not a user here; stdio servers never run as root"
            ) from None
        if entry.pw_uid == 0:
            raise RuntimeError("ELICIT_STDIO_USER names root; stdio servers never run as root")
        return cls(name=name, uid=entry.pw_uid, gid=entry.pw_gid)


def working_dir(slug: str, run_as: RunAs | None, server_id: int | None = None) -> Path:
    """``<ELICIT_STDIO_DIR>/<slug>``, made if missing: mode 0700, owned by the user the server runs as.
    The parent is 0711 so that user can reach its own directory without listing the others.

    With `server_id`, the directory belongs to that server: ``<ELICIT_STDIO_DIR>/.<slug>.server`` (the hub's,
    beside it, out of the server's reach) names its owner. A directory left by another server of the same
    slug (one deleted, then another registered under its name) is emptied first, so the new program never
    inherits what the old one kept in its HOME (cached credentials, tokens). One found without the mark (made
    before it existed) is taken as the server's own."""
    if not slug or "/" in slug or slug in {".", ".."}:
        raise ValueError(f"{slug!r} cannot name a working directory")
    root = Path(settings.ELICIT_STDIO_DIR)
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o711)  # noqa: S103 (traverse only: each server's own directory is 0700)
    path = root / slug
    if server_id is not None:
        owner = root / f".{slug}.server"
        if owner.is_file() and owner.read_text().strip() != str(server_id) and path.is_dir():
            if path.is_symlink():
                path.unlink()
            else:
                shutil.rmtree(path)
            logger.warning("%s: the working directory of an earlier server of this slug was emptied", slug)
        owner.write_text(f"{server_id}\n")
    path.mkdir(mode=0o700, exist_ok=True)
    if path.is_symlink() or not path.is_dir():
        raise RuntimeError(f"the working directory of {slug} is not a plain directory")
    os.chmod(path, 0o700)
    if run_as is not None:
        os.chown(path, run_as.uid, run_as.gid)
        blocked = _untraversable(root.resolve().parent, run_as)
        if blocked is not None:
            raise RuntimeError(
                f"{run_as.name} cannot reach {root}: {blocked} has no execute permission for it "
                "(chmod o+x that directory, or move ELICIT_STDIO_DIR)"
            )
    return path


def _untraversable(directory: Path, run_as: RunAs) -> Path | None:
    """The first directory from `directory` up to / that `run_as` may not pass through, if any."""
    for part in [directory, *directory.parents]:
        mode = part.stat()
        if mode.st_uid == run_as.uid:
            allowed = mode.st_mode & 0o100
        elif mode.st_gid == run_as.gid:
            allowed = mode.st_mode & 0o010
        else:
            allowed = mode.st_mode & 0o001
        if not allowed:
            return part
    return None


def server_parameters(launch: stdio_service.Launch, cwd: Path, run_as: RunAs | None) -> StdioServerParameters:
    """The command line and environment of one start (the command resolved again: it may have moved)."""
    command = stdio_service.check_command(launch.command)
    user = run_as.name if run_as is not None else pwd.getpwuid(os.geteuid()).pw_name
    env = {
        "PATH": f"{os.path.dirname(command)}:{MINIMAL_PATH}",
        "HOME": str(cwd),
        "USER": user,
        "LOGNAME": user,
        # Set, so the SDK's defaults do not pass the hub's own values on.
        "SHELL": "/bin/sh",
        "TERM": "dumb",
        "LANG": "C.UTF-8",
        **launch.env,
    }
    argv = [command, *launch.args]
    setpriv = shutil.which("setpriv")
    if setpriv is not None:
        prefix = [setpriv]
        if run_as is not None:
            prefix += ["--reuid", str(run_as.uid), "--regid", str(run_as.gid), "--clear-groups"]
        # The server dies with its holder (its pipes would close, but a server need not notice).
        argv = [*prefix, "--no-new-privs", "--pdeathsig", "KILL", "--", *argv]
    elif run_as is not None:
        raise RuntimeError("setpriv (util-linux) is needed to run stdio servers unprivileged")
    return StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=str(cwd))


# What separates the parts of a credential written as JSON, a query string, a connection string or a list.
_SEPARATORS = re.compile(r"""[\s"'`,;:=@&?(){}\[\]<>]+""")


def env_secrets(env: dict[str, str]) -> list[str]:
    """What the log must never repeat of a stdio server's configured environment: each value, and each long
    word of it (as for an HTTP server's header values), longest first. A value over several lines (a PEM key,
    a pretty-printed JSON credential) reaches the log line by line, never whole: without its words, none of
    its lines would be recognised. The parts between a credential's quotes and separators count as words too:
    a server logs the secret of a JSON credential (``{"client_secret":"..."}``) or of a connection string
    (``user:password@host``) without them."""
    found: set[str] = set()
    for value in env.values():
        if len(value) >= 4:
            found.add(value)
        found.update(part for part in value.split() if len(part) >= 8)
        found.update(part for part in _SEPARATORS.split(value) if len(part) >= 8)
    return sorted(found, key=len, reverse=True)


class _StdioDispatcher(Dispatcher):
    """A stdio session's dispatcher: `notifications/tools/list_changed` arriving between calls (no call's
    hooks to hear it) still updates the stored tool list."""

    def __init__(self, on_tools_changed: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._on_tools_changed = on_tools_changed
        self._idle_questions = 0

    async def elicitation_callback(self, context: Any, params: Any) -> Any:
        """A question between calls names no call to ask for: declined, as by `Dispatcher`, but logged only
        the 1st, 2nd, 4th, 8th... time (a server may ask without end on a session that outlives its calls)."""
        if self.hooks is not None:
            return await super().elicitation_callback(context, params)
        self._idle_questions += 1
        if self._idle_questions & (self._idle_questions - 1) == 0:
            logger.warning(
                "a stdio server asked a question between calls; declined (%d so far)", self._idle_questions
            )
        return mcp_types.ElicitResult(action="decline")

    async def message_handler(self, message: Any) -> None:
        if self.hooks is None and isinstance(message, mcp_types.ToolListChangedNotification):
            self._on_tools_changed()
            return
        await super().message_handler(message)


@contextlib.asynccontextmanager
async def bounded_stdio_client(
    server: StdioServerParameters, errlog: TextIO, on_broken: Callable[[str], None] | None = None
) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's `stdio_client` (the same start, the same shutdown: stdin closed, a grace period, then the
    process tree killed), with a bounded reader of the server's stdout. The SDK's own reader keeps a line
    until its newline, however long (a server writing without newlines grows the holder's memory without
    end, and the SDK joins each read to all of it: the holder's one event loop, every session it keeps, its
    heartbeat, stalls), and logs a line that is not JSON-RPC with its first characters (a server printing its
    credentials to stdout has them logged). Here a line longer than the hub's limit on a server's answer
    (``ELICIT_MAX_MCP_RESPONSE``) ends the session (`on_broken` is told why; the supervisor restarts the
    server, and a call waiting on it fails at once rather than at its limit); a line that is not a JSON-RPC
    message is dropped, logged with its length only."""
    max_line = netguard.max_response()
    command = await sdk_stdio._get_executable_command(server.command)
    process = await sdk_stdio._create_platform_compatible_process(
        command=command,
        args=server.args,
        env=sdk_stdio.get_default_environment() | (server.env or {}),
        errlog=errlog,
        cwd=server.cwd,
    )
    read_stream_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_stream_reader = anyio.create_memory_object_stream[SessionMessage](0)
    writer_done = anyio.Event()
    garbage = 0

    def parse(line: bytes) -> SessionMessage | Exception:
        nonlocal garbage
        try:
            return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
        except ValueError:
            garbage += 1
            if garbage & (garbage - 1) == 0:  # the 1st, 2nd, 4th...: the log stays bounded
                logger.warning(
                    "a stdio server wrote a line that is not a JSON-RPC message (%d bytes); ignored "
                    "(%d so far)",
                    len(line),
                    garbage,
                )
            # Not the parser's error: its message quotes the line.
            return ValueError(f"a line of {len(line)} bytes that is not a JSON-RPC message")

    async def pump() -> None:
        assert process.stdout is not None
        buffer = bytearray()
        async for chunk in process.stdout:
            start = 0
            while True:
                end = chunk.find(b"\n", start)
                buffer += chunk[start:] if end < 0 else chunk[start:end]
                if len(buffer) > max_line:
                    why = f"it wrote a line longer than {max_line} bytes to its stdout"
                    logger.warning("a stdio server: %s; its session ends", why)
                    if on_broken is not None:
                        on_broken(why)
                    return
                if end < 0:
                    break
                line, start = bytes(buffer), end + 1
                buffer.clear()
                if line.strip():
                    await read_stream_writer.send(parse(line))

    reading = anyio.CancelScope()
    read_done = anyio.Event()
    group_killed = False

    def kill_group() -> None:
        """SIGKILL what is left of the server's process group, once, as soon as the server has exited: the
        group's id (the server's pid, as the server leads its own session) is not given to another process
        while a member lives, but may be once all are gone."""
        nonlocal group_killed
        if not group_killed:
            group_killed = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)

    async def stdout_reader() -> None:
        try:
            async with read_stream_writer:
                with reading, contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                    await pump()
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError, OSError):
            pass  # the pipe closed under the read: the session sees its end
        finally:
            read_done.set()
            # The session has seen the end (the writer is closed): what the server still writes is read
            # and dropped, so a server blocked on a full pipe can exit when its stdin closes.
            await sdk_stdio._drain_stdout(process)

    async def exit_watch() -> None:
        """The server's end is its process's exit, not its stdout's: a child it forked keeps the pipe open
        after it exited (and would run on, orphaned). Once it exited, what is left of its process group is
        killed, which closes the pipe; one that left the group and still holds it open has the session ended
        here, `ORPHAN_GRACE` seconds later."""
        while process.returncode is None:
            await anyio.sleep(EXIT_CHECK_EVERY)
        kill_group()
        with anyio.move_on_after(ORPHAN_GRACE):
            await read_done.wait()
        if not read_done.is_set():
            logger.warning("a stdio server exited, but its stdout is still held open; its session ends")
            reading.cancel()

    async def stdin_writer() -> None:
        assert process.stdin is not None
        try:
            async with write_stream_reader:
                async for session_message in write_stream_reader:
                    data = session_message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((data + "\n").encode())
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_stream_writer.aclose()
        finally:
            writer_done.set()

    async def shutdown() -> None:
        read_stream.close()
        write_stream.close()
        with anyio.move_on_after(sdk_stdio._WRITER_FLUSH_TIMEOUT) as flush_scope:
            await writer_done.wait()
        if flush_scope.cancelled_caught:
            await anyio.lowlevel.cancel_shielded_checkpoint()
        await sdk_stdio._stop_server_process(process)
        # The SDK kills the process group only when the server outlived its grace: one that exited on its
        # own (at its stdin's close, or a crash) leaves its children running, holding its pipes.
        kill_group()
        await sdk_stdio._aclose_all(read_stream, write_stream, read_stream_writer, write_stream_reader)
        await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(stdin_writer)
        tg.start_soon(exit_watch)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                await shutdown()
            tg.cancel_scope.cancel()
    await anyio.lowlevel.cancel_shielded_checkpoint()


class _Watched:
    """The read stream of a stdio transport, which calls `on_end` when it ends: the server's stdout closed
    (it exited), or the transport was closed."""

    def __init__(self, inner: Any, on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_end()
            raise

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        self._on_end()
        await self._inner.aclose()

    async def __aenter__(self) -> _Watched:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


@contextlib.asynccontextmanager
async def _watched(transport: Any, on_end: Callable[[], None]) -> AsyncIterator[tuple[Any, Any]]:
    """`transport` (`bounded_stdio_client`), whose read stream tells `on_end` when the process's stdout
    closes. Its stderr cannot tell: a server may close it, or point it at a file, and go on running."""
    async with transport as (read_stream, write_stream):
        yield _Watched(read_stream, on_end), write_stream


class StdioSupervisor:
    """Runs one stdio server for one holder process; see the module docstring."""

    def __init__(self, server_id: int, holder_name: str) -> None:
        self.server_id = server_id
        self.holder_name = holder_name
        self.slug = ""
        self.restarts = 0  # processes started after the first
        self.lost = False  # the lease went to another holder (or the server was disabled)
        self.last_exit = ""  # why the last process ended
        self._client: Client | None = None
        self._dispatcher: Dispatcher | None = None
        self._ready = asyncio.Event()
        self._wake = asyncio.Event()
        self._ended = asyncio.Event()  # set when the process's stdout closed: it has exited
        self._restart_asked = False
        self._restart_why = ""
        self._broke = ""  # why the transport ended the session, if it did (a line over the limit)
        self._suspect = False  # the last call failed: check the session before the next one
        self._ready_once = False
        self._stopping = False
        self._calls = asyncio.Lock()
        self._starting = asyncio.Lock()
        self._relisting: asyncio.Task[None] | None = None
        self._relist_due = False  # a tools/list_changed came that no listing has followed yet
        self._relisted_at = -math.inf
        self._task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<StdioSupervisor {self.slug or self.server_id} holder={self.holder_name}>"

    # ---- life ------------------------------------------------------------------------------------------

    async def start(self) -> bool:
        """Take the lease and start the server (in the background); False if another live holder runs it.
        `session()` starts a supervisor that was not started, or whose lease went to another holder
        (taking the lease back once that holder released it or its heartbeat went stale)."""
        async with self._starting:
            if self._task is not None and not self._task.done():
                return True
            if self._stopping:
                return False
            # Never started, or it ended (the lease went elsewhere): take the lease again if it is free.
            self._task = None
            if not await sync_to_async(stdio_service.stdio_lease_take)(
                server_id=self.server_id, holder_name=self.holder_name
            ):
                return False
            self.lost = False
            self._task = asyncio.create_task(self._supervise(), name=f"stdio-{self.server_id}")
            return True

    async def stop(self) -> None:
        """End the process and release the lease (if still held)."""
        self._stopping = True
        self._wake.set()
        if self._relisting is not None:
            self._relisting.cancel()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
        if not self.lost:
            await sync_to_async(stdio_service.stdio_lease_release)(
                server_id=self.server_id, holder_name=self.holder_name
            )

    async def __aenter__(self) -> StdioSupervisor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def restart(self, why: str = "a restart was asked") -> None:
        """End the process now (a session the caller found broken); the supervisor starts a new one."""
        self._restart_asked = True
        self._restart_why = why
        self._wake.set()

    # ---- one call at a time -----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def session(self, *, wait: float | None = None) -> AsyncIterator[tuple[Client, Dispatcher]]:
        """Exclusive use of the open client for one call. Waits up to `wait` seconds (default: the hub's
        MCP timeout) for the server to be up; raises `TransientError` ("connect_failed") if it is not:
        nothing was sent, so the call may be tried again."""
        limit = float(settings.ELICIT_MCP_TIMEOUT) if wait is None else wait
        if (self._task is None or self._task.done()) and not await self.start():
            why = "is stopping here" if self._stopping else "is run by another holder"
            raise TransientError("connect_failed", f"the stdio server {self.slug or self.server_id} {why}")
        async with self._calls:
            client, dispatcher = await self._open_session(limit)
            try:
                yield client, dispatcher
            except BaseException as exc:
                # The call failed: the process may have died under it. The next call checks first.
                self._suspect = True
                if isinstance(exc, asyncio.CancelledError) or (
                    isinstance(exc, McpError) and (exc.may_have_run or exc.code == "outcome_unknown")
                ):
                    # It ended without its answer (its limit passed, it was stopped): its tool may run on, and
                    # a question it asks later names no call. On the same session it would reach the next
                    # call's reviewers as that call's (and crowd out that call's own). The next call gets
                    # a new process.
                    self._ready.clear()
                    self.restart(LEFT_RUNNING)
                raise

    async def _open_session(self, limit: float) -> tuple[Client, Dispatcher]:
        deadline = time.monotonic() + limit
        while True:
            if self._task is None or self._task.done() or self._stopping:
                raise TransientError(
                    "connect_failed", f"the stdio server {self.slug or self.server_id} is not run here"
                )
            try:
                await asyncio.wait_for(self._ready.wait(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise TransientError(
                    "connect_failed",
                    f"the stdio server {self.slug} is not running (last exit: {self.last_exit or 'none'})",
                ) from None
            client, dispatcher = self._client, self._dispatcher
            assert client is not None and dispatcher is not None
            if not self._suspect:
                return client, dispatcher
            # After a failed call: one cheap request tells a live session from one whose process is gone.
            try:
                with anyio.fail_after(min(5.0, max(0.1, deadline - time.monotonic()))):
                    await _check_alive(client)
            except Exception:
                logger.warning("%r: the session does not answer; restarting the server", self)
                self._ready.clear()
                self.restart()
                continue
            self._suspect = False
            return client, dispatcher

    # ---- the supervising task ---------------------------------------------------------------------------

    async def _supervise(self) -> None:
        backoff = BACKOFF_MIN
        first = True
        while not self._stopping:
            try:
                held = await self._lease_held()
            except Exception as exc:  # the database is unreachable: try again later
                self.last_exit = f"the lease could not be checked: {type(exc).__name__}"
                held = None
            if held is False:
                self.lost = True
                logger.warning("%r: the lease went to another holder; the server is no longer run here", self)
                break
            if held is None:
                logger.warning("%r: %s; trying again in %.0f s", self, self.last_exit, backoff)
                await self._pause(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
                continue
            if not first:
                self.restarts += 1
                with contextlib.suppress(Exception):
                    await sync_to_async(stdio_service.stdio_restarted)(
                        server_id=self.server_id,
                        holder_name=self.holder_name,
                        reason=self.last_exit,
                        restarts=self.restarts,
                    )
            first = False
            began = time.monotonic()
            try:
                await self._run_once()
            except Exception as exc:
                self.last_exit = f"{type(exc).__name__}: {exc}"[:500]
                logger.error("%r: the server failed: %s", self, self.last_exit)
                if not self._ready_once:
                    with contextlib.suppress(Exception):
                        await sync_to_async(stdio_service.stdio_start_failed)(
                            server_id=self.server_id, message=self.last_exit
                        )
            if self._stopping or self.lost:
                break
            if time.monotonic() - began >= STABLE_AFTER or self.last_exit == LEFT_RUNNING:
                backoff = BACKOFF_MIN
            logger.warning("%r: restarting in %.0f s (%s)", self, backoff, self.last_exit)
            await self._pause(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)

    async def _pause(self, seconds: float) -> None:
        """Wait `seconds`, or less if a stop is asked."""
        self._wake.clear()
        if self._stopping:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    async def _lease_held(self) -> bool:
        return await sync_to_async(stdio_service.stdio_lease_held)(
            server_id=self.server_id, holder_name=self.holder_name
        )

    async def _run_once(self) -> None:
        launch = await sync_to_async(stdio_service.stdio_launch)(server_id=self.server_id)
        self.slug = launch.slug
        run_as = RunAs.configured()
        cwd = working_dir(launch.slug, run_as, self.server_id)
        params = server_parameters(launch, cwd, run_as)
        mode: Mode = "legacy" if launch.era == McpServer.Era.HANDSHAKE else "auto"
        self._ended.clear()
        self._broke = ""
        self._restart_asked = False
        self._suspect = False
        self._ready_once = False  # this start reached an open session
        secrets = env_secrets(launch.env)
        read_fd, write_fd = os.pipe()
        errlog: TextIO = os.fdopen(write_fd, "w")
        pump = asyncio.create_task(self._pump_stderr(read_fd, launch.slug, secrets))
        dispatcher = _StdioDispatcher(self._tools_changed, secrets=secrets)
        transport = _watched(bounded_stdio_client(params, errlog, self._broken), self._exited)
        began = time.monotonic()
        try:
            async with open_client(
                transport, mode=mode, dispatcher=dispatcher, timeout=launch.timeout
            ) as client:
                errlog.close()  # the process has its copy
                # Its era, identity and tools, read on this session (a stdio server is never started twice
                # to be probed), before the first call: routing rules match on the tools' annotations.
                await self._record_probe(client, began, secrets)
                self._ready_once = True
                self._client, self._dispatcher = client, dispatcher
                self._ready.set()
                logger.info("%r: started %s", self, os.path.basename(launch.command))
                await self._until_ended()
        finally:
            self._ready.clear()
            self._client = self._dispatcher = None
            errlog.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(pump), 5)
            pump.cancel()

    def _broken(self, why: str) -> None:
        """The transport ended the session: the server broke the protocol (`why`)."""
        self._broke = why
        logger.warning("%r: %s; the server is restarted", self, why)

    def _exited(self) -> None:
        """The session's read stream ended: the process exited (or its session is being closed)."""
        self._ready.clear()
        self._ended.set()
        self._wake.set()

    async def _record_probe(self, client: Client, began: float, secrets: list[str]) -> None:
        """Store what the new session says of the server. A failure's message quotes the server, which may
        repeat its own credentials (`secrets`): the probe is shown to admins and audited, so they are
        replaced, as in a call's error."""
        latency_ms = int((time.monotonic() - began) * 1000)
        # A tools/list that never answers gives a probe saying so (the stored tools are kept).
        found = await probe_open(
            client, latency_ms=latency_ms, secrets=secrets, timeout=float(settings.ELICIT_MCP_TIMEOUT)
        )
        await sync_to_async(stdio_service.stdio_probed)(
            server_id=self.server_id, found=found.as_json(), tools=found.tools if found.ok else None
        )

    def _tools_changed(self) -> None:
        """Between calls the server said its tools changed: list them on the session (as soon as no call
        runs on it) and store them, at most once every `RELIST_EVERY` seconds. Calls pass the notice to their
        own hooks instead."""
        self._relist_due = True
        if self._relisting is None or self._relisting.done():
            self._relisting = asyncio.create_task(self._relist())

    async def _relist(self) -> None:
        while self._relist_due and not self._stopping:
            wait = self._relisted_at + RELIST_EVERY - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._relist_due = False
            self._relisted_at = time.monotonic()
            try:
                async with self.session() as (client, _):
                    tools = await list_tools_on(client, timeout=float(settings.ELICIT_MCP_TIMEOUT))
                await sync_to_async(servers_service.server_tools_changed)(self.server_id, tools=tools)
            except Exception as exc:
                logger.warning("%r: listing the changed tools failed: %s", self, type(exc).__name__)

    async def _until_ended(self) -> None:
        """Wait until the process exits, a restart or stop is asked, or the lease is lost."""
        while True:
            with anyio.move_on_after(LEASE_CHECK_EVERY):
                await self._wake.wait()
            self._wake.clear()
            if self._stopping:
                self.last_exit = "stopped"
                return
            if self._restart_asked and not self._ended.is_set():
                # Asked because a session looked dead: its process has most likely just exited.
                with anyio.move_on_after(1.0):
                    await self._ended.wait()
            if self._ended.is_set():
                self.last_exit = self._broke or "the process exited"
                return
            if self._restart_asked:
                self.last_exit = self._restart_why or "a restart was asked"
                return
            try:
                held = await self._lease_held()
            except Exception as exc:  # the database is unreachable: the server keeps running meanwhile
                logger.warning("%r: the lease could not be checked: %s", self, type(exc).__name__)
                continue
            if not held:
                self.lost = True
                self.last_exit = "the lease went to another holder"
                return

    async def _pump_stderr(self, read_fd: int, slug: str, secrets: list[str]) -> None:
        """Each stderr line to the log (``approvals.stdio.<slug>``, at INFO), with `secrets` (the values of
        the server's configured environment) replaced, cut at MAX_STDERR_LINE, and at most
        STDERR_BURST lines at once then STDERR_RATE a second (the lines past that are counted, not logged).
        Its end says nothing about the process: it may have closed its stderr and run on."""
        log = logging.getLogger(f"approvals.stdio.{slug}")
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=2 * MAX_STDERR_LINE)
        pipe = os.fdopen(read_fd, "rb", buffering=0)
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
        budget = _LineBudget()
        try:
            async for line in _stderr_lines(reader):
                if not budget.take():
                    continue
                if budget.dropped:
                    log.warning(
                        "[%d stderr lines not logged: more than %d a second]", budget.dropped, STDERR_RATE
                    )
                    budget.dropped = 0
                text = line.decode("utf-8", "replace").rstrip("\r")
                for secret in secrets:
                    text = text.replace(secret, REDACTED)
                if len(line) > MAX_STDERR_LINE:
                    # Cut mid-line by `_stderr_lines`: its end may be the first part of a secret.
                    text = _without_secret_start(text, secrets)
                if len(line) > MAX_STDERR_LINE or len(text) > MAX_STDERR_LINE:
                    text = text[:MAX_STDERR_LINE] + " [cut]"
                log.info("%s", text)
            if budget.dropped:
                log.warning(
                    "[%d stderr lines not logged: more than %d a second]", budget.dropped, STDERR_RATE
                )
        finally:
            transport.close()


class _LineBudget:
    """A token bucket of log lines: STDERR_BURST at once, refilled at STDERR_RATE a second."""

    def __init__(self) -> None:
        self.tokens = float(STDERR_BURST)
        self.at = time.monotonic()
        self.dropped = 0

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(float(STDERR_BURST), self.tokens + (now - self.at) * STDERR_RATE)
        self.at = now
        if self.tokens < 1:
            self.dropped += 1
            return False
        self.tokens -= 1
        return True


async def _stderr_lines(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    """The lines of a stderr, each at most 2 * MAX_STDERR_LINE bytes: the rest of a longer line is dropped
    (its cut end would otherwise begin the next line, a secret in it split past recognition)."""
    buffer = b""
    cut = False  # the line under way was given already, cut: drop the rest of it
    while chunk := await reader.read(MAX_STDERR_LINE):
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if cut:
                cut = False
                continue
            yield line
        if cut:
            buffer = b""
        elif len(buffer) > MAX_STDERR_LINE:
            yield buffer
            buffer, cut = b"", True
    if buffer and not cut:
        yield buffer


def _without_secret_start(text: str, secrets: list[str]) -> str:
    """`text` (a stderr line cut short) without the start of a secret it ends in: a line's rest is dropped, so
    a secret the cut went through is never whole, and `str.replace` would leave its first part in the log."""
    cut = len(text)
    for secret in secrets:
        tail = max(0, len(text) - len(secret) + 1)
        at = text.find(secret[0], tail) if secret else -1
        while 0 <= at < cut:
            if len(text) - at >= 4 and secret.startswith(text[at:]):
                cut = at
                break
            at = text.find(secret[0], at + 1)
    return text if cut == len(text) else text[:cut] + REDACTED


async def _check_alive(client: Client) -> None:
    """One cheap request both ways, in either era (2026-07-28 removed ``ping``): one page of tools/list."""
    await client.list_tools()
