"""Discovery: what a person needs to choose a model. The first run's suggestion with the Hub's speed,
Hub search, a model's shape read from the Hub before a download (so its fit counts the KV cache), its
labels less its quirks, its projector and its parameter count from its files."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.core.errors import ModelError
from app.core.fit import DEFAULT_CONTEXT, FitEstimate, ModelShape
from app.core.gguf import HEADER_FIRST
from app.core.models import Model
from app.core.quirks import effective_labels
from app.core.suggest import suggest
from app.core.units import GB
from app.store.library import Library, ModelFiles
from app.store.model_paths import gguf_architecture, local_parameter_count, local_shape
from app.store.quirks import load_quirks
from app.supervisor.hubsearch import HubResult, search
from app.supervisor.modelmeta import remote_shape
from app.supervisor.router.pulls import Pulls
from app.supervisor.router.runtime import Runtime
from app.supervisor.supervisor import Supervisor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Suggestion:
    """The model the first-run welcome offers, with what a person needs to decide."""

    model: Model
    size_bytes: int
    fit: FitEstimate
    reason: str  # why this one
    speed_bps: float | None  # the Hub's speed, measured by reading the model's header; None if unknown
    note: str = ""  # why the Hub could not be asked, when it could not

    @property
    def download_s(self) -> float | None:
        return self.size_bytes / self.speed_bps if self.speed_bps else None


class Discover:
    def __init__(
        self, library: Callable[[], Library], supervisor: Supervisor, pulls: Pulls, runtime: Runtime
    ) -> None:
        self._library = library
        self._supervisor = supervisor
        self._pulls = pulls
        self._runtime = runtime
        self._shapes: dict[str, ModelShape] = {}  # by checkpoint, read from the Hub before a download
        self.shape_errors: dict[str, str] = {}  # by checkpoint: why the Hub's header could not be read

    def shape(self, files: ModelFiles) -> ModelShape | None:
        """The model's shape from its header when read: on disk, or from the Hub (``measure_fit``)."""
        shape = self._shapes.get(files.model.checkpoint)
        if shape is None and files.local is not None:
            with contextlib.suppress(ModelError, OSError):
                shape = local_shape(files.model.recipe, files.local.main)
        return shape

    async def measure_fit(self, name: str) -> None:
        """Read a model's header from the Hub (a Range read, once) so that its fit counts the KV cache."""
        library = self._library()
        model = library.resolve(name)
        if model.checkpoint in self._shapes or model.repo_id is None or library.local_files(model):
            return
        try:
            _, files = await self._pulls.plan_pull(model)
            self._shapes[model.checkpoint] = await remote_shape(await self._pulls.hub(), files)
            self.shape_errors.pop(model.checkpoint, None)
        except ModelError as err:
            self.shape_errors[model.checkpoint] = str(err)
        self._runtime.changed(model.name)

    async def suggestion(
        self, context: int, fit_of: Callable[[Model], FitEstimate | None]
    ) -> Suggestion | None:
        """The model a first run offers, its size from the Hub and the Hub's speed measured on its header;
        ``fit_of`` gives its fit as the views show it, once its header is read."""
        info = await self._supervisor.info()
        runnable = {recipe for recipe, support in info.recipes.items() if support.default_backend}
        choice = suggest(self._library().models().values(), runnable, info.hardware, context)
        if choice is None:
            return None
        model, size, speed, note = choice.model, int(choice.model.size_gb * GB), None, ""
        try:
            _, files = await self._pulls.plan_pull(model)
            size = files.size
            started = time.monotonic()
            self._shapes[model.checkpoint] = await remote_shape(await self._pulls.hub(), files)
            elapsed = time.monotonic() - started
            read = min(files.size, HEADER_FIRST) if model.recipe == "llamacpp" else 0
            speed = read / elapsed if read >= HEADER_FIRST // 4 and elapsed > 0 else None
        except ModelError as err:
            note = str(err)
        fit = await asyncio.to_thread(fit_of, model)  # reads the models' cache: not on the loop
        return Suggestion(model, size, fit or choice.fit, choice.reason, speed, note)

    async def search_hub(
        self, query: str, recipe: str | None = None, limit: int = 10, context: int = DEFAULT_CONTEXT
    ) -> list[HubResult]:
        """Hugging Face search: each hit's variants with their sizes and fit at ``context``."""
        hardware = self._supervisor.known_hardware or (await self._supervisor.info()).hardware
        return await search(await self._pulls.hub(), query, recipe, limit, hardware, context)

    def labels(self, model: Model) -> tuple[str, ...]:
        """A model's labels less what its quirks strip (``resources/quirks.json``: GLM-4 GGUF has no
        ``mtp``); the architecture comes from the model's file when it is here. Reads a header."""
        local = self._library().local_files(model) if model.recipe == "llamacpp" else None
        architecture = gguf_architecture(local.main) if local is not None else ""
        return effective_labels(model.labels, load_quirks(), model.recipe, architecture)

    def projector(self, model: Model) -> Path | None:
        """The projector a GGUF model loads with, as Lemonade gives llama-server ``--mmproj``: for a
        model labelled ``vision`` or naming its projector, when the file is here."""
        if "vision" not in model.labels and not model.mmproj:
            return None
        local = self._library().local_files(model)
        return local.mmproj if local is not None else None

    def local_parameter_count(self, model: Model) -> int | None:
        """A model's parameters from its files on disk (GGUF tensor infos, safetensors headers); None
        when it is not here or its headers say nothing. Reads files: call it in a thread on the loop."""
        local = self._library().local_files(model)
        if local is None:
            return None
        try:
            return local_parameter_count(model.recipe, local.main)
        except ModelError as err:
            log.info("no parameter count for %s: %s", model.name, err)
            return None
