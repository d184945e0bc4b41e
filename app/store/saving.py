"""One way to say that a file the app keeps could not be saved: a ``StorageError`` with the OS's reason
and where to look, for the options, the collections and the remotes alike."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from app.core.errors import StorageError
from app.store.paths import home


def unsaved(what: str, err: OSError) -> StorageError:
    """Why ``what`` (``"the collections"``) could not be saved, for people."""
    return StorageError(f"Could not save {what}: {err.strerror}.", f"Check that {home()} is writable.")


@contextlib.contextmanager
def saving(what: str) -> Iterator[None]:
    """Run the block that saves ``what``; an OSError in it becomes ``unsaved(what, err)``."""
    try:
        yield
    except OSError as err:
        raise unsaved(what, err) from None
