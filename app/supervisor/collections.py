"""Collections through the router: save the loaded models (or a list) with their recipe options, load a
collection under the loading policy, export and import Lemonade's collection file, remove.

The file format and its validation are ``app.store.collections``; this is the one place that turns a
collection into router calls, for the CLI and the window alike.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from app.core.errors import ConfigError, LemonDeskError, ModelError
from app.core.models import Model
from app.core.names import USER_PREFIX
from app.store.collections import (
    Collection,
    Member,
    check_collection_name,
    load_collections,
    read_collection_file,
    save_collections,
    write_collection_file,
)
from app.store.saving import saving

if TYPE_CHECKING:
    import asyncio

    from app.store.library import Library
    from app.store.model_options import ModelOptions
    from app.supervisor.engine import Engine


class Router(Protocol):
    """What collections need of the router (``app.supervisor.router.Router``), which owns them: named
    here so that this module sits below the router without importing it."""

    warnings: list[str]
    library: Library

    def loaded(self) -> list[str]: ...

    def options(self, name: str) -> ModelOptions: ...

    def load(self, model: str | Model, options: ModelOptions | None = None) -> asyncio.Task[Engine]: ...


@dataclasses.dataclass(frozen=True)
class Imported:
    collection: Collection
    registered: tuple[str, ...]  # members that were new here and are now user models
    warnings: tuple[str, ...]  # members kept as defined here though the file defines them otherwise


class Collections:
    """The saved collections (``<home>/collections.json``) and the router calls that use them."""

    def __init__(self, router: Router) -> None:
        self.router = router
        loaded = load_collections()
        self._items = loaded.items
        if loaded.warning:
            router.warnings.append(loaded.warning)

    def all(self) -> list[Collection]:
        return [self._items[n] for n in sorted(self._items)]

    def get(self, name: str) -> Collection:
        bare = check_collection_name(name)
        try:
            return self._items[bare]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "none yet"
            raise ConfigError(f"There is no collection named {bare}.", f"Collections: {known}.") from None

    def _store(self) -> None:
        with saving("the collections"):
            save_collections(self._items)

    def save(self, name: str, models: list[str] | None = None) -> Collection:
        """Save ``models`` (default: the loaded ones) with their recipe options as collection ``name``."""
        bare = check_collection_name(name)
        names = models if models else self.router.loaded()
        if not names:
            raise ModelError("No model is loaded, so there is nothing to save.", "Name the models to save.")
        members = []
        for given in dict.fromkeys(names):
            model = self.router.library.resolve(given)
            members.append(Member(model, self.router.options(model.name)))
        collection = Collection(bare, tuple(members))
        self._items[bare] = collection
        self._store()
        return collection

    def remove(self, name: str) -> None:
        """Forget a collection; its models and their files stay."""
        collection = self.get(name)
        del self._items[collection.name]
        self._store()

    def export(self, name: str, path: Path) -> Collection:
        collection = self.get(name)
        write_collection_file(collection, path)
        return collection

    def import_file(self, path: Path, *, replace: bool = False) -> Imported:
        """Read and check a collection file, register the members this machine does not know, keep it.

        A member whose name is known here keeps its definition here (a difference is a warning), as
        Lemonade does; an unknown one becomes a user model (``user.`` is added to a bare name). A
        collection of the same name here is replaced only when ``replace`` says so."""
        collection = read_collection_file(path)
        if collection.name in self._items and not replace:
            raise ConfigError(
                f"There is a collection named {collection.name} here already; nothing was imported.",
                "Import it with --replace to put it in that one's place, or remove that one first.",
            )
        library = self.router.library
        known = library.models()
        members, registered, warnings = [], [], []
        for member in collection.members:
            model = member.model
            local = known.get(model.name)
            if local is None and not model.name.startswith(USER_PREFIX):
                model = dataclasses.replace(model, name=USER_PREFIX + model.name)
                local = known.get(model.name)
            if local is not None:
                if (local.recipe, local.checkpoint) != (model.recipe, model.checkpoint):
                    warnings.append(
                        f"{local.name}: kept this machine's {local.recipe} {local.checkpoint}, not the "
                        f"file's {model.recipe} {model.checkpoint}."
                    )
                model = local
            else:
                library.register(model)
                registered.append(model.name)
            members.append(Member(model, member.options))
        collection = Collection(collection.name, tuple(members))
        self._items[collection.name] = collection
        self._store()
        return Imported(collection, tuple(registered), tuple(warnings))

    async def load(self, name: str) -> list[str]:
        """Load every member with the collection's options, one after another, under the loading policy
        (caps may unload earlier members or other models, as for any load). Returns the names loaded."""
        collection = self.get(name)
        loaded = []
        for member in collection.members:
            try:
                await self.router.load(member.model, member.options)
            except LemonDeskError as err:
                raise ModelError(
                    f"Collection {collection.name}: {member.model.name} did not load: {err.message}",
                    err.hint,
                ) from err
            loaded.append(member.model.name)
        return loaded
