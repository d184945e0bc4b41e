"""llama.cpp RPC workers: probing one (is it there, does it speak our protocol, how much memory does it
offer) and running one (``lemon-desk worker``, or the window's worker).

A probe is a short TCP conversation: HELLO, DEVICE_COUNT, GET_DEVICE_MEMORY per device (the wire format
is in ``app.core.rpc``). A worker serves one client at a time, so a worker whose connection is accepted
but that does not answer HELLO is *busy*: another engine is using it.

A ``Worker`` runs ``ggml-rpc-server`` as a ``ChildProcess`` (no orphan on any exit path). It is ready
once it answers a probe; when it dies it is started again after 1 s, 5 s, 30 s, and after three deaths in
five minutes it stays down, with its last words. Its states are the engine's (``EngineState``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.core import rpc
from app.core.engine_state import EngineState, can_transition
from app.core.errors import EngineError, WorkerError
from app.core.launch import QUIET_ABORT, LaunchPlan, child_environment, library_env
from app.core.policy import CRASH_LIMIT, CRASH_WINDOW_S, RESTART_BACKOFF_S, STABLE_S, restart_delay
from app.core.rpc import Endpoint, WorkerInfo
from app.store.paths import logs_dir
from app.supervisor.child import ChildProcess
from app.supervisor.listeners import Listeners
from app.supervisor.process import describe_exit, free_port

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 3.0
READY_TIMEOUT_S = 30.0
READY_POLL_S = 0.05
STOP_GRACE_S = 5.0
RPC_SERVER = "ggml-rpc-server"  # llama.cpp's worker, beside llama-server in its release archives


# --- probing ----------------------------------------------------------------------------------------------


async def probe(endpoint: Endpoint, timeout_s: float = PROBE_TIMEOUT_S) -> WorkerInfo:
    """Ask a worker its protocol and memory. WorkerError says what is wrong, naming the worker.

    The handshake is tried as this protocol's (with a capability block), then as older ones' (without):
    a worker closes the connection on a HELLO of the wrong size, and the engine, not the probe, decides
    which versions it accepts (``check_workers`` compares with the engine's own build)."""
    for hello in (rpc.hello_request(), rpc.request(rpc.CMD_HELLO)):
        reader, writer = await _connect(endpoint, timeout_s)
        try:
            version = await _hello(endpoint, reader, writer, hello, timeout_s)
            if version is not None:
                return WorkerInfo(endpoint, version, await _memory(reader, writer, timeout_s))
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    raise WorkerError(
        f"{endpoint} closed the connection at the handshake: it is not a llama.cpp RPC worker, or one too "
        "old to say its protocol version.",
        "Run `lemon-desk worker` there, from the same llama.cpp version as this machine's.",
        (str(endpoint),),
    )


async def _connect(endpoint: Endpoint, timeout_s: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    try:
        return await asyncio.wait_for(asyncio.open_connection(endpoint.host, endpoint.port), timeout_s)
    except (OSError, TimeoutError) as err:
        why = os.strerror(err.errno) if isinstance(err, OSError) and err.errno else "no answer"
        raise WorkerError(
            f"The RPC worker {endpoint} is unreachable ({why.lower()}).",
            "Check that `lemon-desk worker` runs there and that its port is open, or leave it out.",
            (str(endpoint),),
        ) from None


async def _ask(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, message: bytes, limit: int = 64
) -> bytes:
    writer.write(message)
    await writer.drain()
    size = rpc.reply_size(await reader.readexactly(8))
    if size > limit:
        raise ValueError(f"a reply of {size} bytes")
    return await reader.readexactly(size)


async def _hello(
    endpoint: Endpoint,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    hello: bytes,
    timeout_s: float,
) -> tuple[int, int, int] | None:
    """The worker's protocol version; None when it closed the connection (a HELLO of another size)."""
    try:
        reply = await asyncio.wait_for(_ask(reader, writer, hello), timeout_s)
    except TimeoutError:
        raise WorkerError(
            f"The RPC worker {endpoint} is busy: another engine is using it.",
            "A worker serves one engine at a time; unload the model that uses it, or leave it out.",
            (str(endpoint),),
        ) from None
    except (OSError, asyncio.IncompleteReadError, ValueError):
        return None
    return rpc.parse_version(reply) if len(reply) >= 3 else None


async def _memory(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout_s: float
) -> tuple[tuple[int, int], ...]:
    """Each device's free and total bytes; empty when the worker does not say (older protocols)."""
    try:
        count = rpc.parse_device_count(
            await asyncio.wait_for(_ask(reader, writer, rpc.request(rpc.CMD_DEVICE_COUNT)), timeout_s)
        )
        return tuple(
            [
                rpc.parse_device_memory(
                    await asyncio.wait_for(_ask(reader, writer, rpc.device_memory_request(d)), timeout_s)
                )
                for d in range(min(count, 64))
            ]
        )
    except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError, struct.error):
        return ()


async def check_workers(
    workers: tuple[Endpoint, ...], expected: tuple[int, int, int] | None = None
) -> list[WorkerInfo]:
    """Probe every worker at once; one WorkerError names each that cannot serve a load. ``expected``:
    the engine's own protocol version (a worker of another major version, or a newer minor, is refused,
    as llama.cpp would at load)."""
    results = await asyncio.gather(*(probe(w) for w in workers), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, WorkerError):
            raise result
    failed = [r for r in results if isinstance(r, WorkerError)]
    if expected is not None:
        failed += [
            _mismatch(r, expected) for r in results if isinstance(r, WorkerInfo) and not _speaks(r, expected)
        ]
    if len(failed) == 1:
        raise failed[0]
    if failed:
        names = tuple(name for err in failed for name in err.workers)
        raise WorkerError(
            f"{len(failed)} RPC workers cannot serve this load:\n"
            + "\n".join(f"- {err.message}" for err in failed),
            "Start them, or load without them.",
            names,
        )
    return [r for r in results if isinstance(r, WorkerInfo)]


def _speaks(info: WorkerInfo, expected: tuple[int, int, int]) -> bool:
    return info.version[0] == expected[0] and info.version[1] <= expected[1]


def _mismatch(info: WorkerInfo, expected: tuple[int, int, int]) -> WorkerError:
    return WorkerError(
        f"The RPC worker {info.endpoint} speaks RPC protocol {_dotted(info.version)}; this machine's "
        f"llama.cpp speaks {_dotted(expected)}.",
        "Install the same llama.cpp version on both machines.",
        (str(info.endpoint),),
    )


def _dotted(version: tuple[int, int, int]) -> str:
    return ".".join(map(str, version))


_own_protocols: dict[tuple[str, float], tuple[int, int, int] | None] = {}


async def engine_protocol(engine_binary: Path, library_dir: str, os_name: str) -> tuple[int, int, int] | None:
    """The RPC protocol the engine at ``engine_binary`` speaks, learnt from the worker of its build; None
    when its build has no worker to ask. EngineError when the engine has no RPC support at all."""
    worker = rpc_server_binary(engine_binary)
    env = library_env(os_name, library_dir, os.environ)
    if worker is not None:
        return await own_protocol(worker, env)
    if not await _has_rpc_flag(engine_binary, env):
        raise EngineError(
            f"{engine_binary} was built without RPC support: it has no --rpc option.",
            "Use the llamacpp:cpu backend (llama.cpp's releases are built with RPC), or build llama.cpp "
            "with -DGGML_RPC=ON.",
        )
    return None


async def _has_rpc_flag(binary: Path, env: dict[str, str]) -> bool:
    proc = await asyncio.create_subprocess_exec(
        str(binary),
        "--help",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, **env},
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 30.0)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return True  # it could not say: llama-server's own error will, at load
    return b"--rpc" in out


async def own_protocol(worker_binary: Path, plan_env: dict[str, str]) -> tuple[int, int, int] | None:
    """The RPC protocol of this machine's llama.cpp build: its own worker started on a free loopback port
    for a moment and asked (once per build). None when it cannot say."""
    key = (str(worker_binary), worker_binary.stat().st_mtime)
    if key not in _own_protocols:
        endpoint = Endpoint("127.0.0.1", free_port())
        plan = LaunchPlan((str(worker_binary), "-H", endpoint.host, "-p", str(endpoint.port)), plan_env)
        worker = Worker(plan, endpoint, log_path=logs_dir() / "worker-protocol-check.log")
        try:
            _own_protocols[key] = (await worker.start()).version
        except EngineError as err:
            log.warning("could not learn this llama.cpp's RPC protocol: %s", err.message)
            _own_protocols[key] = None
        finally:
            await worker.stop()
    return _own_protocols[key]


async def lost_workers(workers: tuple[Endpoint, ...]) -> list[Endpoint]:
    """Those of ``workers`` that no longer accept connections (after an engine using them died). A busy
    or live worker is not lost; only a refused or silent connection counts."""
    reachable = await asyncio.gather(*(_reachable(w) for w in workers))
    return [worker for worker, up in zip(workers, reachable, strict=True) if not up]


async def _reachable(endpoint: Endpoint) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(endpoint.host, endpoint.port), 1.0)
    except (OSError, TimeoutError):
        return False
    writer.close()  # the worker sees a client that leaves before HELLO, and goes on
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


# --- running a worker -----------------------------------------------------------------------------------


def rpc_server_binary(engine_binary: Path) -> Path | None:
    """The worker program of the llama.cpp build that ``engine_binary`` (its llama-server) belongs to."""
    for name in (RPC_SERVER, "rpc-server"):
        candidate = engine_binary.with_name(name)
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def worker_plan(
    binary: Path, library_dir: str, endpoint: Endpoint, threads: int | None, os_name: str
) -> LaunchPlan:
    """``ggml-rpc-server -H HOST -p PORT [-t N]``, with the engine's library path."""
    threads_args = ("-t", str(threads)) if threads else ()
    argv = (str(binary), "-H", endpoint.host, "-p", str(endpoint.port), *threads_args)
    return LaunchPlan(argv, {**library_env(os_name, library_dir, os.environ), **QUIET_ABORT})


@dataclass(frozen=True)
class WorkerChanged:
    """The app's own worker changed state; ``message`` says what happened, for people."""

    endpoint: str
    state: EngineState
    message: str
    info: WorkerInfo | None = None
    final: bool = False  # it stays down: it died too often, or did not start again


class Worker:
    """One ``ggml-rpc-server`` the app runs and keeps running. Use it from the app's event loop."""

    def __init__(
        self,
        plan: LaunchPlan,
        endpoint: Endpoint,
        *,
        log_path: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.plan = plan
        self.endpoint = endpoint
        self.state = EngineState.STOPPED
        self.info: WorkerInfo | None = None
        self.error: EngineError | None = None
        name = f"worker-{endpoint.host}-{endpoint.port}".replace(":", "_")
        self.process = ChildProcess(name, log_path or logs_dir() / f"{name}.log")
        self._clock = clock
        self._listeners: Listeners[WorkerChanged] = Listeners(f"the worker {endpoint}")
        self._deaths: list[float] = []
        self._streak = 0
        self._ready_at = 0.0
        self._keeper: asyncio.Task[None] | None = None

    def subscribe(self, listener: Callable[[WorkerChanged], None]) -> Callable[[], None]:
        return self._listeners.add(listener)

    def _set_state(self, new: EngineState, message: str, final: bool = False) -> None:
        if not can_transition(self.state, new):
            raise RuntimeError(
                f"worker {self.endpoint}: {self.state.value} -> {new.value} is not a legal move"
            )
        self.state = new
        log.info("%s", message)
        self._listeners.emit(WorkerChanged(str(self.endpoint), new, message, self.info, final))

    async def start(self) -> WorkerInfo:
        """Run the worker until it answers a probe; then keep it running. EngineError when it does not
        start (its last words quoted)."""
        info = await self._start_once()
        self._keeper = asyncio.create_task(self._keep(), name=f"worker {self.endpoint}")
        return info

    async def _start_once(self, again: bool = False) -> WorkerInfo:
        self._set_state(EngineState.STARTING, f"starting the RPC worker on {self.endpoint}")
        self.error = None
        try:
            try:
                env = child_environment(os.environ, self.plan)
                # A client that leaves mid-reply (an engine that crashed) must not kill the worker.
                await self.process.spawn(self.plan.argv, env, ignore_sigpipe=True)
            except OSError as err:
                raise EngineError(
                    f"Could not run {self.plan.argv[0]}: {err.strerror}.", "Reinstall the llama.cpp backend."
                ) from None
            self.info = await self._wait_ready()
        except asyncio.CancelledError:
            self._set_state(EngineState.STOPPING, f"stopping the RPC worker on {self.endpoint}")
            await self.process.terminate(STOP_GRACE_S)
            self.process.close_log()
            self._set_state(EngineState.STOPPED, f"the RPC worker on {self.endpoint} stopped")
            raise
        except EngineError as err:
            await self.process.terminate(STOP_GRACE_S)
            self.process.close_log()
            self.error = err
            self._set_state(EngineState.FAILED, err.message, final=again)
            raise
        self._ready_at = self._clock()
        self._set_state(EngineState.READY, f"the RPC worker is ready: {self.info.describe()}")
        return self.info

    async def _wait_ready(self) -> WorkerInfo:
        exited = self.process.exited
        assert exited is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if exited.done():
                raise EngineError(
                    f"The RPC worker exited at start ({describe_exit(exited.result())}).",
                    "Its last words are below (a port in use says so).",
                    self.process.last_output(),
                )
            with contextlib.suppress(WorkerError):
                return await probe(self.endpoint, 1.0)
            if time.monotonic() > deadline:
                raise EngineError(
                    f"The RPC worker did not answer within {READY_TIMEOUT_S:g} s.",
                    "",
                    self.process.last_output(),
                )
            await asyncio.wait({exited}, timeout=READY_POLL_S)

    async def _keep(self) -> None:
        """Start the worker again each time it dies, with backoff, until it dies too often."""
        while True:
            exited = self.process.exited
            assert exited is not None
            code = await asyncio.shield(exited)
            self.process.close_log()
            now = self._clock()
            if now - self._ready_at >= STABLE_S:
                self._streak = 0
            self._deaths = [t for t in self._deaths if now - t < CRASH_WINDOW_S] + [now]
            why = f"The RPC worker on {self.endpoint} stopped ({describe_exit(code)})."
            if len(self._deaths) >= CRASH_LIMIT:
                self.error = EngineError(
                    f"{why} It died {len(self._deaths)} times in {CRASH_WINDOW_S / 60:g} minutes, so it was "
                    "not started again.",
                    "Its last words are below.",
                    self.process.last_output(),
                )
                self._set_state(EngineState.CRASHED, self.error.message, final=True)
                return
            delay = restart_delay(self._streak, RESTART_BACKOFF_S)
            self._streak += 1
            self.error = EngineError(why, f"Starting it again in {delay:g} s.", self.process.last_output())
            self._set_state(EngineState.CRASHED, f"{why} Starting it again in {delay:g} s.")
            await asyncio.sleep(delay)
            try:
                await self._start_once(again=True)
            except EngineError:
                return

    async def stop(self) -> None:
        """Stop the worker and its keeper; safe in any state and twice."""
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
        if self.state is EngineState.READY:
            self._set_state(EngineState.STOPPING, f"stopping the RPC worker on {self.endpoint}")
            await self.process.terminate(STOP_GRACE_S)
            self.process.close_log()
            self._set_state(EngineState.STOPPED, f"the RPC worker on {self.endpoint} stopped")
        else:
            await self.process.terminate(STOP_GRACE_S)
            self.process.close_log()
