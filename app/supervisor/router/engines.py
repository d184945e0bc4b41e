"""Engines as front ends see them: ``EngineSnapshot`` values (read-only copies taken now), an engine's
output as it prints it, its end, and why a reply it cut short ended. Front ends never hold a live
``Engine``: what they show cannot change the process, and a snapshot is safe to keep."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from app.core.backends import BackendKey
from app.core.engine_state import EngineState
from app.core.errors import EngineError, LemonDeskError, RequestError
from app.core.launch import engine_device
from app.core.lemon_mlx import DeviceType
from app.supervisor.engine import Engine, launched_ctx_size
from app.supervisor.router.runtime import Runtime
from app.supervisor.supervisor import LoadOptions, Supervisor


def device_of(engine: Engine) -> DeviceType:
    return engine_device(engine.request, engine.hardware)


@dataclass(frozen=True)
class EngineSnapshot:
    """One engine as it is now."""

    model: str  # the model's name, which is the engine's id
    checkpoint: str  # what the engine was asked to run (a file, a folder or a repo id)
    backend: BackendKey
    device: DeviceType
    ctx_size: int | None  # as launched (None: the engine's own default)
    pid: int | None
    base_url: str  # "" until it listens
    argv: tuple[str, ...]  # the command it was last started with (the key file, not the key)
    state: EngineState
    error: EngineError | None  # why it failed or crashed
    log_path: Path
    lines: tuple[str, ...]  # its recent output, newest last
    placement: dict[str, int] = field(default_factory=dict)  # bytes per device, from its load's lines

    def last_words(self, count: int) -> str:
        """Its last ``count`` lines, as an error quotes them."""
        return "\n".join(self.lines[-count:])


class Engines:
    def __init__(self, supervisor: Supervisor, runtime: Runtime) -> None:
        self._supervisor = supervisor
        self._runtime = runtime

    def get(self, name: str) -> EngineSnapshot | None:
        """The model's engine as it is now (any state), None when it has none."""
        engine = self._supervisor.engines.get(name)
        if engine is None:
            return None
        record = self._runtime.get(name)
        return EngineSnapshot(
            model=name,
            checkpoint=engine.request.model,
            backend=engine.request.backend_key,
            device=device_of(engine),
            ctx_size=launched_ctx_size(engine),
            pid=engine.pid,
            base_url=engine.base_url,
            argv=tuple(engine.argv),
            state=engine.state,
            error=engine.error,
            log_path=engine.log_path,
            lines=tuple(engine.output),
            placement=dict(record.placement) if record is not None else {},
        )

    def state(self, name: str) -> EngineState | None:
        engine = self._supervisor.engines.get(name)
        return engine.state if engine is not None else None

    def launched_with(self, name: str) -> LoadOptions | None:
        """The options a running model was loaded with (None when it is not loaded)."""
        record = self._runtime.get(name)
        return record.launched_with if record is not None and name in self._supervisor.engines else None

    def __contains__(self, name: str) -> bool:
        return name in self._supervisor.engines

    def follow_output(self, name: str, listener: Callable[[str], None]) -> Callable[[], None] | None:
        """Call ``listener(line)`` for each line the model's engine prints from now on; returns the
        function that stops it, None when the model has no engine."""
        engine = self._supervisor.engines.get(name)
        return engine.add_output_listener(listener) if engine is not None else None

    async def ended(self, name: str) -> EngineError | None:
        """Wait until the model's engine of now crashes or stops; its error when it crashed."""
        engine = self._supervisor.engines.get(name)
        if engine is None:
            return None
        await engine.wait_for_state(EngineState.CRASHED, EngineState.STOPPED)
        return engine.error if engine.state is EngineState.CRASHED else None

    async def explain(self, name: str, error: RequestError) -> LemonDeskError:
        """Why a reply of the model's engine failed: its crash when it crashed, else ``error``."""
        engine = self._supervisor.engines.get(name)
        return await engine.explain(error) if engine is not None else error
