"""The one "save or raise" of the files the app keeps (options, pins, collections, remotes, user models,
downloads, bench results): the block that writes one runs in ``saving``, and an OSError in it becomes a
``StorageError`` with the OS's reason and where to look. The chat history's SQLite writes say the same
in their own words (``app.store.history``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from app.core.errors import StorageError
from app.store.paths import home


@contextlib.contextmanager
def saving(what: str) -> Iterator[None]:
    """Run the block that saves ``what`` (``"the collections"``); an OSError in it is a StorageError."""
    try:
        yield
    except OSError as err:
        raise StorageError(
            f"Could not save {what}: {err.strerror}.", f"Check that {home()} is writable."
        ) from None
