"""What the router knows of each model while the app runs: one ``ModelRuntime`` record per model, and
the recipe options (with pins) saved for every later load.

A record is made the first time a model is touched and dropped in one call (``Runtime.forget``), so
forgetting a model does not depend on remembering every fact kept about it. Records are not saved:
they describe this run (the engine, its load, its crashes); the saved options are.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.core.models import Model
from app.core.status import LoadState, check_load_move
from app.store.model_options import ModelOptions, load_model_options, save_model_options
from app.store.saving import saving
from app.supervisor.router.events import Emit, LoadProgress, ModelsChanged
from app.supervisor.supervisor import LoadOptions

if TYPE_CHECKING:
    from app.supervisor.engine import Engine


@dataclass
class ModelRuntime:
    """One model's facts for this run."""

    name: str
    model: Model | None = None  # what its engine runs, for restarts (None: not launched by the router)
    launched_with: LoadOptions | None = None  # the options of its last launch
    pin: bool | None = None  # a pin its running load set for itself alone (None: as saved)
    used: float | None = None  # last load or request, on the router's clock (None: not loaded)
    busy: int = 0  # requests in flight
    streaming: int = 0  # replies streaming to their readers (first token sent)
    state: LoadState = LoadState.IDLE  # where its load is (``move`` changes it)
    error: str = ""  # failed, restarting or gave up: why, and what the router does about it
    progress: LoadProgress | None = None  # a one-click load's last progress in its phase
    crashes: list[float] = field(default_factory=list)  # recent crash times, for the give-up rule
    streak: int = 0  # restarts in a row without a stable run
    ready_at: float | None = None  # when its engine last became ready
    version: str = ""  # the engine version it was last loaded with
    placement: dict[str, int] = field(default_factory=dict)  # bytes per device, while loaded (RPC loads)
    lost_workers: tuple[str, ...] = ()  # the RPC workers a crashed load lost, till it loads again
    load: asyncio.Task[Engine] | None = None  # the one-click load under way
    restart: asyncio.Task[Engine] | None = None  # the restart after a crash, under way

    def move(self, state: LoadState, error: str = "") -> None:
        """The one place a model's ``LoadState`` changes (IllegalMove when the table forbids it)."""
        check_load_move(self.name, self.state, state)
        self.state, self.error = state, error
        if self.progress is not None and self.progress.phase is not state:
            self.progress = None

    def unloaded(self) -> None:
        """Its engine stopped at someone's request: what only a running engine has goes."""
        self.model = None
        self.used = None
        self.pin = None
        if self.state is LoadState.RUNNING:
            self.move(LoadState.IDLE)

    def stop_recovery(self) -> None:
        """Cancel a restart under way (unless it is the caller) and forget the crashes behind it."""
        restart, self.restart = self.restart, None
        if restart is not None and restart is not asyncio.current_task():
            restart.cancel()
        self.crashes = []
        self.streak = 0


class Runtime:
    """Every model's ``ModelRuntime``, and the options saved in ``<home>/model_options.json``."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit
        loaded = load_model_options()
        self.saved: dict[str, ModelOptions] = loaded.items
        self.warning = loaded.warning
        self._records: dict[str, ModelRuntime] = {}

    def __getitem__(self, name: str) -> ModelRuntime:
        """The model's record, made when it has none."""
        record = self._records.get(name)
        if record is None:
            record = self._records[name] = ModelRuntime(name)
        return record

    def changed(self, *names: str) -> None:
        """Tell front ends that the facts behind these models' statuses changed (none: every model's)."""
        self.emit(ModelsChanged(names))

    def set_phase(self, name: str, phase: LoadState, done: int = 0, total: int = 0, detail: str = "") -> None:
        """A one-click load entered ``phase`` (one of ``LOAD_PHASES``), or moved on within it."""
        progress = LoadProgress(name, phase, done, total, detail)
        record = self[name]
        record.move(phase)
        record.progress = progress
        self.emit(progress)
        self.changed(name)

    def in_phase(self, name: str, phase: LoadState) -> LoadProgress | None:
        """The model's load's progress when it is in ``phase``."""
        record = self._records.get(name)
        return record.progress if record is not None and record.state is phase else None

    def forget_failure(self, name: str) -> None:
        """The model is pulled again: a failed load, or a crash given up on, is no longer its status."""
        record = self[name]
        if record.state in (LoadState.FAILED, LoadState.GAVE_UP):
            record.move(LoadState.IDLE)

    def get(self, name: str) -> ModelRuntime | None:
        return self._records.get(name)

    def items(self) -> Iterator[tuple[str, ModelRuntime]]:
        return iter(list(self._records.items()))

    def forget(self, name: str) -> None:
        """Drop everything known of the model in this run (its saved options stay)."""
        self._records.pop(name, None)

    def loads(self) -> dict[str, asyncio.Task[Engine]]:
        return {n: r.load for n, r in self._records.items() if r.load is not None}

    def restarts(self) -> dict[str, asyncio.Task[Engine]]:
        return {n: r.restart for n, r in self._records.items() if r.restart is not None}

    def track(self, name: str, task: asyncio.Task[Engine], *, restart: bool = False) -> None:
        """Keep ``task`` as the model's load (or restart) until it ends or another replaces it."""
        record = self[name]
        attribute = "restart" if restart else "load"
        setattr(record, attribute, task)

        def done(finished: asyncio.Task[Engine]) -> None:
            if getattr(record, attribute) is finished:
                setattr(record, attribute, None)

        task.add_done_callback(done)

    # --- saved options and pins -----------------------------------------------------------------------

    def options(self, name: str) -> ModelOptions:
        return self.saved.get(name, ModelOptions())

    def store(self, name: str, options: ModelOptions) -> None:
        """Save a model's options for every later load."""
        self.saved[name] = options
        self.save(name)
        self.changed(name)

    def store_options(self, name: str, options: ModelOptions) -> None:
        """Save a model's recipe options; its pin stays as it is."""
        self.store(name, dataclasses.replace(options, pinned=self.options(name).pinned))

    def store_pin(self, name: str, pinned: bool) -> None:
        """Save the model's pin; a pin its running load set for itself gives way."""
        self[name].pin = None
        self.store(name, dataclasses.replace(self.options(name), pinned=pinned))

    def drop_options(self, name: str) -> None:
        if self.saved.pop(name, None) is not None:
            self.save(name)

    def save(self, name: str) -> None:
        with saving(f"the options of {name}"):
            save_model_options(self.saved)

    def pinned(self, name: str, running: Callable[[str], bool]) -> bool:
        """As the model's running load pinned it for itself alone, else as saved."""
        record = self._records.get(name)
        if record is not None and record.pin is not None and running(name):
            return record.pin
        return self.options(name).pinned
