"""A pull followed as it goes, for the dialects that stream a download's progress (Lemonade's SSE,
Ollama's NDJSON): the router's one download of a model's files, its progress events as they come.

A follower that stops early (its client went away) leaves the download running: it goes on in the
app, where it can be paused or cancelled (``lemon-desk downloads``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

from app.core.downloads import DownloadState
from app.core.errors import ModelError
from app.core.models import Model
from app.core.refs import FileSet
from app.supervisor.downloads import DownloadProgress

if TYPE_CHECKING:
    from app.supervisor.router import Router, RouterEvent


async def pulled(router: Router, model: Model, files: FileSet) -> None:
    """The router's download of ``model``'s files, to its end; a ModelError when it did not finish
    (paused or cancelled in the app meanwhile), which the dialect says in its own shape."""
    try:
        record = await router.download(model, files)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # this request was cancelled (its client went away), not the download
        raise ModelError(
            f"The download of {model.name} was cancelled in the app.", "Pull it again to start over."
        ) from None
    if record.state is not DownloadState.DONE:
        raise ModelError(
            f"The download of {model.name} was {record.state.value} in the app before it finished.",
            "Resume it there (or with `lemon-desk downloads`), or pull it again.",
        )


async def followed(router: Router, model: Model, files: FileSet) -> AsyncGenerator[DownloadProgress, None]:
    """The download's progress, until it ends; then raises why it failed, if it did."""
    queue: asyncio.Queue[DownloadProgress] = asyncio.Queue()

    def on_event(event: RouterEvent) -> None:
        if isinstance(event, DownloadProgress) and event.id == model.checkpoint:
            queue.put_nowait(event)

    unsubscribe = router.subscribe(on_event)
    download = asyncio.ensure_future(pulled(router, model, files))
    getter: asyncio.Future[DownloadProgress] | None = None
    try:
        while not download.done() or not queue.empty():
            getter = asyncio.ensure_future(queue.get())
            await asyncio.wait({getter, download}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                yield getter.result()
            else:
                getter.cancel()
                await asyncio.gather(getter, return_exceptions=True)
        download.result()
    finally:
        unsubscribe()
        if getter is not None and not getter.done():
            getter.cancel()  # the client went away during the wait
        if not download.done():
            download.cancel()  # this wait only: the download goes on (``Router.download``)
        await asyncio.gather(download, return_exceptions=True)
