"""This machine's RPC worker (``ggml-rpc-server`` from its llama.cpp backend), run as the Settings say
or as the CLI asks; its state comes as ``WorkerChanged`` events."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from app.core.engine_state import EngineState
from app.core.errors import EngineError, LemonDeskError
from app.core.rpc import Endpoint, exposure_warning, worker_endpoint
from app.store.settings import Settings
from app.supervisor.router.backends import install_backend
from app.supervisor.router.events import Emit
from app.supervisor.rpc import Worker, WorkerChanged, rpc_server_binary, worker_plan
from app.supervisor.supervisor import Supervisor


class Workers:
    def __init__(
        self,
        supervisor: Supervisor,
        settings: Callable[[], Settings],
        emit: Emit,
        started: Callable[[], Awaitable[None]],
    ) -> None:
        self._supervisor = supervisor
        self._started = started  # the router's start: engines an earlier run left are stopped first
        self._settings = settings
        self._emit = emit
        self.worker: Worker | None = None  # this machine's RPC worker, when it runs one

    async def start(
        self, endpoint: Endpoint, backend: str | None = None, threads: int | None = None
    ) -> Worker:
        """Run an RPC worker from this machine's llama.cpp backend, installing the backend first when it
        is installable or out of date; kept running until ``stop`` or shutdown. Binding beyond loopback
        is the caller's decision to check (``app.core.rpc.exposure_warning``)."""
        await self.stop()
        await self._started()
        supervisor = self._supervisor
        await install_backend(supervisor, "llamacpp", backend)
        _, engine, library_dir = await supervisor.engine_binary("llamacpp", backend)
        binary = rpc_server_binary(engine)
        if binary is None:
            raise EngineError(
                f"The llama.cpp build in {engine.parent} has no ggml-rpc-server, so it cannot be a worker.",
                "Use the llamacpp:cpu backend (llama.cpp's releases carry it), or build llama.cpp with "
                "-DGGML_RPC=ON.",
            )
        plan = worker_plan(binary, library_dir, endpoint, threads, supervisor.hardware.os)
        worker = Worker(plan, endpoint)
        worker.subscribe(self._emit)
        self.worker = worker
        await worker.start()
        return worker

    async def sync(self) -> None:
        """Run this machine's worker as the Settings say (the window's): started, moved to another
        address, or stopped. What stops it from running comes as a final ``WorkerChanged``."""
        settings = self._settings()
        current = self.worker
        try:
            wanted = worker_endpoint(settings.worker_host, settings.worker_port)
            if settings.worker_enabled:
                exposure_warning(wanted, settings.worker_allow_network)
        except LemonDeskError as err:
            where = f"{settings.worker_host}:{settings.worker_port}"
            self._emit(WorkerChanged(where, EngineState.FAILED, str(err), final=True))
            return
        if not settings.worker_enabled:
            await self.stop()
            return
        if current is not None and current.endpoint == wanted and current.state is not EngineState.CRASHED:
            return
        try:
            await self.start(wanted)
        except LemonDeskError as err:
            if self.worker is None or self.worker.state is not EngineState.FAILED:  # else it said so itself
                self._emit(WorkerChanged(str(wanted), EngineState.FAILED, str(err), final=True))

    async def stop(self) -> None:
        worker, self.worker = self.worker, None
        if worker is not None:
            await worker.stop()
