"""A pull followed as it goes, for the dialects that stream a download's progress (Lemonade's SSE,
Ollama's NDJSON): the router's one download of a model's files, its progress events as they come.

A follower that stops early (its client went away) leaves the download running: it goes on in the
app, where it can be paused or cancelled (``lemon-desk downloads``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

from app.core.models import Model
from app.core.refs import FileSet
from app.supervisor.downloads import DownloadProgress

if TYPE_CHECKING:
    from app.supervisor.router import Router, RouterEvent


async def followed(router: Router, model: Model, files: FileSet) -> AsyncGenerator[DownloadProgress, None]:
    """The download's progress, until it ends; then raises why it failed, if it did."""
    queue: asyncio.Queue[DownloadProgress] = asyncio.Queue()

    def on_event(event: RouterEvent) -> None:
        if isinstance(event, DownloadProgress) and event.id == model.checkpoint:
            queue.put_nowait(event)

    unsubscribe = router.subscribe(on_event)
    download = asyncio.ensure_future(router.download(model, files))
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
        if not download.done():
            download.cancel()  # this wait only: the download goes on (``Router.download``)
        await asyncio.gather(download, return_exceptions=True)
