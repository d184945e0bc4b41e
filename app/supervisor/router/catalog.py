"""The catalog: the library of models as front ends may use it (look up, define, find files, import),
behind the router, so that none of them holds the ``Library`` the router swaps when the models folder
moves."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from app.core.models import Model
from app.store.library import Library, LocalFiles


class Catalog:
    def __init__(self, library: Callable[[], Library]) -> None:
        self._library = library

    def models(self) -> dict[str, Model]:
        return self._library().models()

    def resolve(self, name_or_ref: str) -> Model:
        """A model by name or Hub reference (``org/repo:VARIANT``); an unknown one is a ModelError."""
        return self._library().resolve(name_or_ref)

    def find(self, name: str) -> Model:
        return self._library().find(name)

    def define(self, model: Model) -> Model:
        """A user model as it would be kept, checked against those defined already (keeps nothing)."""
        return self._library().define(model)

    def local_files(self, model: Model) -> LocalFiles | None:
        return self._library().local_files(model)

    @property
    def cache_root(self) -> Path:
        return self._library().cache_root

    def import_path(self, path: Path, name: str | None = None) -> Model:
        """Use a model file or folder where it is (reads it: call it in a thread on the loop)."""
        return self._library().import_path(path, name)

    def take_warnings(self) -> list[str]:
        """The library's warnings (files set aside, ...), each given once."""
        warnings = self._library().warnings
        taken = list(warnings)
        warnings.clear()
        return taken
