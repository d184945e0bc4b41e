"""One running engine: a child process with an explicit state machine, readiness, a watchdog and a clean stop.

Its life is drawn in ``app.core.engine_state``, whose ``_TRANSITIONS`` is the one place that says which
moves are legal; ``_set_state`` here is the one place that makes them. Every path out of a running
process reaps it.

A READY engine is watched for hangs two ways: a request in flight that gets no data for ``hang_grace_s``,
and, when no request is in flight, a cheap ``/health`` every ``idle_probe_s``. Either way /health must
then fail ``HANG_PROBES`` times in a row before the engine is declared hung and killed (CRASHED).

No engine outlives the app: its process is a ``ChildProcess`` (``child.py``: PDEATHSIG or a reaper, a
run record, SIGTERM then SIGKILL, always reaped).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.client.adapters import adapter_for
from app.client.chat import ChatClient, loopback_ssl
from app.core.engine_state import EngineState, can_transition
from app.core.errors import EngineError, LemonDeskError, RequestError
from app.core.hardware import Hardware
from app.core.launch import LaunchPlan, LaunchRequest, child_environment, plan_launch
from app.core.rpc import parse_endpoint
from app.store.files import atomic_write_bytes
from app.store.paths import logs_dir, run_dir
from app.supervisor.child import LAST_WORDS, ChildProcess, OutputListener
from app.supervisor.listeners import Listeners
from app.supervisor.process import describe_exit, free_port
from app.supervisor.rpc import lost_workers
from app.supervisor.tps import telemetry_source

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

HEALTH_POLL_S = 0.1
# A small model is ready a few hundred ms after the spawn: polling 10x faster for the first seconds
# keeps the wait after it is ready to ~5 ms instead of ~50 (a refused or 503 /health costs ~1 ms).
HEALTH_POLL_FIRST_S = 0.01
HEALTH_FAST_FOR_S = 2.0
HEALTH_TIMEOUT_S = 2.0
HANG_PROBES = 3  # /health failures in a row, after the grace period, that make a hang
IDLE_PROBE_S = 15.0  # how often an idle READY engine's /health is checked
EXPLAIN_WAIT_S = 5.0  # how long a broken request waits to learn whether the engine died
STOP_HOOKS_TIMEOUT_S = 60.0  # what a stop waits for its hooks (saving KV caches) before it goes on

StateListener = Callable[[EngineState], None]
StopHook = Callable[["Engine"], Awaitable[None]]


def launched_ctx_size(engine: Engine) -> int | None:
    """The context size an engine was started with, from its command line (None: the engine's own)."""
    argv = list(engine.argv)
    if "--ctx-size" in argv[:-1]:
        value = argv[argv.index("--ctx-size") + 1]
        return int(value) if value.isdigit() else None
    return engine.request.ctx_size


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "engine"


class _Watch:
    """The engine's view of its client's traffic, for the hang check (a ``RequestObserver``)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.in_flight = 0
        self.last_activity = time.monotonic()
        self.woken: asyncio.Future[None] | None = None  # the idle watchdog's, set when a request starts

    def request_started(self) -> None:
        self.in_flight += 1
        self.last_activity = time.monotonic()
        if self.woken is not None and not self.woken.done():
            self.woken.set_result(None)

    def data_received(self) -> None:
        self.last_activity = time.monotonic()

    def request_finished(self) -> None:
        self.in_flight -= 1
        self.last_activity = time.monotonic()

    def silent_for(self, grace_s: float) -> bool:
        return self.in_flight > 0 and time.monotonic() - self.last_activity > grace_s

    async def explain(self, error: RequestError) -> LemonDeskError:
        return await self._engine.explain(error)


class Engine:
    """An engine process for one model. Not thread-safe: use it from the supervisor's event loop."""

    def __init__(
        self,
        engine_id: str,
        request: LaunchRequest,
        hardware: Hardware,
        *,
        load_timeout_s: float = 600.0,
        hang_grace_s: float = 90.0,
        stop_grace_s: float = 10.0,
        idle_probe_s: float = IDLE_PROBE_S,
        port: int | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.id = engine_id
        self.request = request
        self.hardware = hardware
        self.load_timeout_s = load_timeout_s
        self.hang_grace_s = hang_grace_s
        self.stop_grace_s = stop_grace_s
        self.idle_probe_s = idle_probe_s
        self.log_path = log_path or logs_dir() / f"engine-{_safe_name(engine_id)}.log"
        self.name = os.path.basename(request.binary)  # e.g. "llama-server", for messages
        self.state = EngineState.STOPPED
        self.error: EngineError | None = None  # why it FAILED or CRASHED
        self.process = ChildProcess(engine_id, self.log_path)
        self.output = self.process.output  # stdout and stderr lines, newest last
        self.port: int | None = None
        self.argv: tuple[str, ...] = ()  # the command it was last started with (the key file, not the key)
        self.api_key: str | None = None
        self.lost_workers: tuple[str, ...] = ()  # RPC workers found gone when it crashed ("host:port")
        self.watch = _Watch(self)
        self._fixed_port = port
        self._state_listeners: Listeners[EngineState] = Listeners(f"engine {engine_id}'s state")
        self._changed = asyncio.Event()
        self._watchdog: asyncio.Task[None] | None = None
        self._starting: asyncio.Task[object] | None = None
        self._http: httpx.AsyncClient | None = None  # health probes
        self._requests: httpx.AsyncClient | None = None  # requests, shared by every chat client
        self._hang: str | None = None
        self._stop_hooks: list[StopHook] = []
        self._before_stop: asyncio.Future[None] | None = None  # the hooks' run, shared by every stop
        self.telemetry = telemetry_source(request)  # engine-printed speed figures, where it prints them
        if self.telemetry is not None:
            self.add_output_listener(self.telemetry.feed)

    # --- what others read and listen to -------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}" if self.port else ""

    def add_state_listener(self, listener: StateListener) -> Callable[[], None]:
        """Call ``listener(new_state)`` on every change; returns a function that removes it."""
        return self._state_listeners.add(listener)

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def add_stop_hook(self, hook: StopHook) -> None:
        """Await ``hook(engine)`` when a stop is asked of the READY engine, before it stops (the engine
        still answers then: its KV caches can be saved). A hook that fails or overruns is logged."""
        self._stop_hooks.append(hook)

    def add_output_listener(self, listener: OutputListener) -> Callable[[], None]:
        """Call ``listener(line)`` for each line the engine prints; returns a function that removes it."""
        return self.process.add_output_listener(listener)

    def last_output(self, lines: int = LAST_WORDS) -> str:
        return self.process.last_output(lines)

    async def wait_for_state(self, *states: EngineState) -> EngineState:
        while self.state not in states:
            await self._changed.wait()
        return self.state

    def chat_client(self, request_timeout_s: float = 300.0) -> ChatClient:
        """A client for this engine, watched by its watchdog; close it when done."""
        if self.state is not EngineState.READY:
            raise EngineError(f"The {self.name} engine for {self.id} is not running ({self.state.value}).")
        if self._requests is None:
            import httpx

            # One pool for every request while the engine runs: a new httpx client costs tens of ms.
            # No connection limit: the engine's own slots decide what runs and what queues. Idle
            # connections are dropped well before llama-server's own 5 s keep-alive ends, so a request
            # never goes out on a connection the engine is closing at that moment.
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=2.0)
            self._requests = httpx.AsyncClient(base_url=self.base_url, trust_env=False, limits=limits)
        return ChatClient(
            self.base_url,
            self.api_key,
            adapter=adapter_for(self.request.recipe),
            observer=self.watch,
            telemetry=self.telemetry,
            request_timeout_s=request_timeout_s,
            http=self._requests,
        )

    # --- transitions -------------------------------------------------------------------------------

    def _set_state(self, new: EngineState) -> None:
        if not can_transition(self.state, new):
            raise RuntimeError(f"engine {self.id}: {self.state.value} -> {new.value} is not a legal move")
        self.state = new
        self._changed.set()
        self._changed = asyncio.Event()
        self._state_listeners.emit(new)

    # --- start --------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Launch and wait until ready. Raises EngineError (state FAILED) with the engine's last words.

        Bad options (a reserved flag, an unknown recipe) raise before anything starts.
        """
        self.port = self._fixed_port or free_port()
        key_file = run_dir() / f"{_safe_name(self.id)}-{secrets.token_hex(8)}.key"
        plan = plan_launch(self.request, self.hardware, str(self.port), str(key_file), os.environ)
        self._set_state(EngineState.STARTING)
        self.error = None
        self._hang = None
        self._before_stop = None
        self._starting = asyncio.current_task()
        try:
            await self._spawn(plan)
            await self._wait_ready()
        except asyncio.CancelledError:
            self._set_state(EngineState.STOPPING)
            await self._terminate()
            self._set_state(EngineState.STOPPED)
            raise
        except BaseException as err:
            await self._terminate()
            self.error = err if isinstance(err, EngineError) else EngineError(f"{self.name} failed: {err}")
            self._set_state(EngineState.FAILED)
            raise
        finally:
            self._starting = None
            key_file.unlink(missing_ok=True)  # read at start-up: the secret need not stay on disk
        self._set_state(EngineState.READY)
        self._watchdog = asyncio.create_task(self._watch_ready(), name=f"watchdog {self.id}")

    async def _spawn(self, plan: LaunchPlan) -> None:
        self.api_key = None
        if plan.api_key_file:
            self.api_key = secrets.token_urlsafe(32)
            atomic_write_bytes(Path(plan.api_key_file), f"{self.api_key}\n".encode())  # 0600 (mkstemp)
        self.argv = plan.argv
        try:
            await self.process.spawn(plan.argv, child_environment(os.environ, plan))
        except OSError as err:
            raise EngineError(
                f"Could not run {plan.argv[0]}: {err.strerror}.", "Reinstall the backend and try again."
            ) from None
        import httpx

        self._http = httpx.AsyncClient(base_url=self.base_url, trust_env=False, verify=loopback_ssl())

    async def _wait_ready(self) -> None:
        import httpx

        assert self.process.exited is not None and self._http is not None
        started = time.monotonic()
        deadline = started + self.load_timeout_s
        while True:
            probe = asyncio.create_task(self._http.get("/health", timeout=HEALTH_TIMEOUT_S))
            try:
                await asyncio.wait({probe, self.process.exited}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                # A load cancelled here, or an engine that exited first, must not leave the probe behind.
                probe.cancel()  # does nothing once it is done
                await asyncio.gather(probe, return_exceptions=True)
            if self.process.exited.done():
                raise EngineError(
                    f"{self.name} exited while loading {self._model_name()} "
                    f"({describe_exit(self.process.exited.result())}).",
                    "Its last words say why.",
                    self.last_output(),
                )
            with contextlib.suppress(httpx.HTTPError):
                if probe.result().status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise EngineError(
                    f"{self.name} did not become ready within {self.load_timeout_s:g} s.",
                    "Big models can take minutes: raise the load timeout in Settings.",
                    self.last_output(),
                )
            fast = time.monotonic() - started < HEALTH_FAST_FOR_S
            await asyncio.wait({self.process.exited}, timeout=HEALTH_POLL_FIRST_S if fast else HEALTH_POLL_S)

    def _model_name(self) -> str:
        return os.path.basename(self.request.model.rstrip("/")) or self.request.model

    # --- watchdog -----------------------------------------------------------------------------------

    async def _watch_ready(self) -> None:
        """Notice an engine that exits, or one that hangs: a request in flight silent past the grace, or
        an idle engine whose periodic /health fails. Idle, it sleeps until the next probe is due or a
        request starts (an idle app is not woken every second for nothing)."""
        assert self.process.exited is not None
        tick = min(1.0, self.hang_grace_s / 4, self.idle_probe_s)
        next_idle_probe = time.monotonic() + self.idle_probe_s
        loop = asyncio.get_running_loop()
        while not self.process.exited.done():
            if self.watch.in_flight:
                await asyncio.wait({self.process.exited}, timeout=tick)
            else:
                due = max(next_idle_probe, self.watch.last_activity + self.idle_probe_s)
                self.watch.woken = loop.create_future()
                either: set[asyncio.Future[Any]] = {self.process.exited, self.watch.woken}
                await asyncio.wait(
                    either,
                    timeout=due - time.monotonic(),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                self.watch.woken.cancel()
            if self.process.exited.done():
                break
            if self.watch.silent_for(self.hang_grace_s):
                why = f"no reply data for {self.hang_grace_s:g} s, then /health failed {HANG_PROBES} times"
            elif self.watch.in_flight == 0 and time.monotonic() >= max(
                next_idle_probe, self.watch.last_activity + self.idle_probe_s
            ):
                why = f"while idle, /health failed {HANG_PROBES} times in a row"
            else:
                continue
            hung = await self._unhealthy()
            next_idle_probe = time.monotonic() + self.idle_probe_s
            if hung:
                self._hang = f"{self.name} stopped responding to /health ({why}), so it was killed."
                self.process.emit([f"=== {self._hang}"])
                self.process.kill()
                await asyncio.shield(self.process.exited)
        if self.state is EngineState.READY:
            message = self._hang or (
                f"{self.name} stopped unexpectedly ({describe_exit(self.process.exited.result())})."
            )
            hint = "Load the model again."
            lost = (
                await lost_workers(tuple(map(parse_endpoint, self.request.rpc))) if self.request.rpc else []
            )
            self.lost_workers = tuple(str(worker) for worker in lost)
            if lost:  # llama.cpp aborts when a worker goes: the worker is the cause to name
                said = "; ".join(f"the RPC worker {worker} is unreachable" for worker in lost)
                message = f"{message[:-1]}: {said}."
                hint = "Start the worker again, or load the model without it."
            self.error = EngineError(message, hint, self.last_output())
            await self._release()  # before CRASHED: a listener may start the engine again at once
            self._set_state(EngineState.CRASHED)

    async def _unhealthy(self) -> bool:
        """True when /health fails HANG_PROBES times in a row; a success restarts the grace period.

        False when the process exits meanwhile: that is a crash, reported with its own exit, not a hang.
        """
        import httpx

        assert self._http is not None and self.process.exited is not None
        timeout = min(5.0, self.hang_grace_s)
        for attempt in range(HANG_PROBES):
            if attempt:
                await asyncio.wait({self.process.exited}, timeout=HEALTH_POLL_S)
            if self.process.exited.done():
                return False
            with contextlib.suppress(httpx.HTTPError):
                if (await self._http.get("/health", timeout=timeout)).status_code == 200:
                    self.watch.last_activity = time.monotonic()
                    return False
        return not self.process.exited.done()

    async def explain(self, error: RequestError) -> LemonDeskError:
        """Why a request broke: the engine's crash (waiting briefly to learn of it), else ``error``."""
        settled = (EngineState.CRASHED, EngineState.STOPPING, EngineState.STOPPED, EngineState.FAILED)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wait_for_state(*settled), EXPLAIN_WAIT_S)
        if self.state is EngineState.CRASHED and self.error is not None:
            return self.error
        return error

    # --- stop ---------------------------------------------------------------------------------------

    async def stop(self) -> None:
        """SIGTERM, a grace period, SIGKILL; always reaped. Safe in any state and to call twice."""
        if self.state is EngineState.STARTING and self._starting is not None:
            starting = self._starting
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            return
        if self.state is EngineState.READY:
            await self._run_stop_hooks()  # it still answers: its KV caches can be saved
        if self.state is EngineState.STOPPING:  # another stop is under way (or went on first)
            await self.wait_for_state(EngineState.STOPPED)
            return
        if self.state is not EngineState.READY:  # never ready, stopped, or crashed meanwhile
            return
        self._set_state(EngineState.STOPPING)
        if self._watchdog is not None:
            self._watchdog.cancel()
            await asyncio.gather(self._watchdog, return_exceptions=True)
        await self._terminate()
        self._set_state(EngineState.STOPPED)

    async def _run_stop_hooks(self) -> None:
        """Run the stop hooks once for every stop asked meanwhile, within STOP_HOOKS_TIMEOUT_S."""
        if not self._stop_hooks:
            return
        if self._before_stop is None:

            async def run() -> None:
                for hook in self._stop_hooks:
                    try:
                        await hook(self)
                    except Exception:
                        log.exception("a stop hook of engine %s failed", self.id)

            self._before_stop = asyncio.ensure_future(run())
        done, _ = await asyncio.wait({self._before_stop}, timeout=STOP_HOOKS_TIMEOUT_S)
        if not done:
            log.warning(
                "engine %s: its stop hooks took over %g s; stopping it anyway", self.id, STOP_HOOKS_TIMEOUT_S
            )
            self._before_stop.cancel()
            await asyncio.gather(self._before_stop, return_exceptions=True)

    async def _terminate(self) -> None:
        await self.process.terminate(self.stop_grace_s)
        await self._release()

    async def _release(self) -> None:
        """After the process is gone: its connection pool, its log, its key."""
        self.process.close_log()
        for pool in (self._http, self._requests):
            if pool is not None:
                await pool.aclose()
        self._http = self._requests = None
        self.api_key = None
