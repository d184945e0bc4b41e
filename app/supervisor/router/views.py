"""Views: a model as every front end shows it (``ModelView``), built from the library's disk facts and
the router's runtime facts; the only caller of ``app.core.status.model_status``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.core.engine_state import EngineState
from app.core.fit import DEFAULT_CONTEXT, SIZE_ONLY, FitEstimate, ModelShape, estimate
from app.core.models import Model
from app.core.status import LoadState, ModelFacts, ModelStatus, model_status, on_disk, unfinished
from app.core.units import GB
from app.store.library import Library, ModelFiles
from app.supervisor.router.discover import Discover
from app.supervisor.router.pulls import Pulls
from app.supervisor.router.runtime import Runtime
from app.supervisor.supervisor import Supervisor


@dataclass(frozen=True)
class ModelView:
    """A model as every front end shows it: what it is, where its files are, and its one status."""

    model: Model
    status: ModelStatus
    on_disk: bool
    size_bytes: int
    files: ModelFiles
    fit: FitEstimate | None = None  # at the model's context; None until the hardware is known
    fit_exact: bool = False  # False: by size alone (the header is not read yet), a lower bound
    fit_note: str = ""  # why the header could not be read, when it could not
    context_window: int | None = None  # the context the model was trained for, once its header is read
    memory: dict[str, int] = dataclasses.field(default_factory=dict)  # loaded: bytes per device, from its log
    lost_workers: tuple[str, ...] = ()  # crashed: the RPC workers found gone ("host:port"), to load without

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def sees_images(self) -> bool:
        """It loads with a vision projector (its files include an mmproj), so images can be sent to it."""
        local = self.files.local
        return local is not None and local.mmproj is not None

    def to_json(self) -> dict[str, Any]:
        data = self.model.to_json()
        data["state"] = self.status.status.value
        data["downloaded"] = self.on_disk
        local, d = self.files.local, self.files.download
        data["path"] = str(local.main) if local else None
        data["mmproj"] = str(local.mmproj) if local and local.mmproj else None
        shown = d is not None and (unfinished(d.state) if self.model.repo_id else local is not None)
        data["download"] = (
            {"done_bytes": d.done_bytes, "total_bytes": d.files.size, "message": d.message}
            if shown and d is not None
            else None
        )
        data["pinned"] = self.status.pinned
        data["message"] = self.status.message
        return data


class Views:
    def __init__(
        self,
        library: Callable[[], Library],
        supervisor: Supervisor,
        runtime: Runtime,
        pulls: Pulls,
        discover: Discover,
        pinned: Callable[[str], bool],
    ) -> None:
        self._library = library
        self._supervisor = supervisor
        self._runtime = runtime
        self._pulls = pulls
        self._discover = discover
        self._pinned = pinned

    def statuses(self) -> list[ModelView]:
        """Every model with its status; reads the cache, so front ends on the loop call it in a thread."""
        return [self._view(f) for f in self._library().all_files(self._pulls.records())]

    def status(self, name: str) -> ModelView:
        library = self._library()
        return self._view(library.files(library.resolve(name), self._pulls.records()))

    def fit_of(self, model: Model) -> FitEstimate | None:
        """A model's fit as its view shows it, whether or not it is on disk or downloading."""
        return self._view(self._library().files(model, None)).fit

    def _engine_state(self, name: str) -> EngineState | None:
        engine = self._supervisor.engines.get(name)
        return engine.state if engine is not None else None

    def _facts(self, files: ModelFiles, here: bool) -> ModelFacts:
        name = files.model.name
        record = files.download
        known = self._runtime.get(name)
        progress = known.progress if known is not None else None
        done, total = (progress.done, progress.total) if progress else (0, 0)
        if progress is None and record is not None:
            done, total = self._pulls.done_bytes(record), record.files.size
        return ModelFacts(
            on_disk=here,
            download=record.state if record is not None else None,
            done_bytes=done,
            total_bytes=total,
            download_message=record.message if record is not None else "",
            load=known.state if known is not None else LoadState.IDLE,
            engine=self._engine_state(name),
            error=known.error if known is not None else "",
            pinned=self._pinned(name),
        )

    def _view(self, files: ModelFiles) -> ModelView:
        model, local = files.model, files.local
        download = files.download.state if files.download is not None else None
        here = on_disk(local is not None, model.repo_id is not None, download)
        size = local.size if local and local.size else int(model.size_gb * GB)
        shape = self._discover.shape(files)
        fit, exact = self._fit(files, size, shape)
        note = self._discover.shape_errors.get(model.checkpoint, "")
        window = (shape.context_train or None) if shape is not None else None
        status = model_status(self._facts(files, here))
        known = self._runtime.get(model.name)
        memory = dict(known.placement) if known is not None else {}
        lost = known.lost_workers if known is not None else ()
        return ModelView(model, status, here, size, files, fit, exact, note, window, memory, lost)

    def _fit(self, files: ModelFiles, size: int, shape: ModelShape | None) -> tuple[FitEstimate | None, bool]:
        """The fit at the model's context: from its header when read, else by size alone."""
        model = files.model
        hardware = self._supervisor.known_hardware
        if hardware is None or (not size and files.local is None):
            return None, False
        context = self._runtime.options(model.name).ctx_size or DEFAULT_CONTEXT
        recipe = model.recipe or "llamacpp"
        return estimate(size, shape or SIZE_ONLY, hardware, recipe, context), shape is not None
