"""One remote server as ``Remotes`` keeps it: its record, its state and what its last look found, its
key and its connections. A look is one task shared by everyone who asks for one meanwhile; what it
finds moves the state in one place (``_set_state``: one ``RemoteChanged`` event and one log line per
move). When to look (the watcher's schedule) and which remotes there are is ``Remotes``'s business.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.client import remote as remote_http
from app.client.remote import Probe
from app.core.errors import RemoteError
from app.core.remotes import RemoteKind, RemoteModelInfo, RemoteState, can_transition
from app.store.remotes import RemoteRecord
from app.store.secrets import get_remote_key
from app.supervisor.remote_views import RemoteChanged, RemoteSnapshot

if TYPE_CHECKING:
    import httpx

# The remotes' one logger: a remote's moves are told as the component's (``app.supervisor.remotes``).
log = logging.getLogger("app.supervisor.remotes")


@dataclass(eq=False)
class Remote:
    """One remote, kept by ``Remotes``: what it is (``record``), what its looks found, and its tasks."""

    record: RemoteRecord
    emit: Callable[[RemoteChanged], None]
    state: RemoteState = RemoteState.UNKNOWN
    kind: RemoteKind | None = None
    version: str = ""
    message: str = ""
    since: float = field(default_factory=time.time)
    models: tuple[RemoteModelInfo, ...] = ()
    failures: int = 0  # looks in a row that found it down (the backoff's step)
    key_value: str | None = None
    key_read: bool = False
    http: httpx.AsyncClient | None = None
    watcher: asyncio.Task[None] | None = None  # set once watched (the window, serve): it then logs moves loud
    looking: asyncio.Task[None] | None = None
    looking_since: float = 0.0  # when that look began (monotonic)
    moved: asyncio.Event = field(default_factory=asyncio.Event)  # its state changed (the watcher's rest ends)
    gone: bool = False  # removed: what a look under way finds is dropped

    def __repr__(self) -> str:  # never the key
        return f"Remote({self.record.name}, {self.record.url}, {self.state.name})"

    def snapshot(self) -> RemoteSnapshot:
        r = self.record
        return RemoteSnapshot(
            r.name,
            r.url,
            self.state,
            self.kind,
            self.version,
            self.message,
            self.since,
            r.has_key,
            self.models,
        )

    def unreachable(self) -> RemoteError:
        name = self.record.name
        return RemoteError(
            f"The remote {name} cannot be reached at {self.record.url}: {self.message}.",
            f"Check that the server is running and that this machine can reach it (`lemon-desk remote list` "
            f"shows {name}'s state). Lemon Desk keeps looking and uses it again as soon as it answers.",
            remote=name,
        )

    # --- looking ------------------------------------------------------------------------------------

    async def look(self, deadline_s: float, since: float | None = None) -> None:
        """Look at the remote once; looks asked for while one is under way wait for that one. ``since``
        (monotonic): a look under way that began before then does not do, another follows it."""
        while True:
            if self.looking is None or self.looking.done():
                self.looking = asyncio.ensure_future(self._probe(deadline_s))
                self.looking_since = time.monotonic()
            began = self.looking_since
            try:
                await asyncio.shield(self.looking)
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise  # this caller was cancelled; a look stopped by a removal or close is not that
                return
            if since is None or began >= since or self.gone:
                return

    async def _probe(self, deadline_s: float) -> None:
        try:
            key = await self.key()
            found = await asyncio.wait_for(remote_http.probe(self.pool(), key), deadline_s)
        except TimeoutError:
            found = Probe(RemoteState.UNREACHABLE, f"it did not answer within {deadline_s:g} s")
        except Exception as err:  # a look must never end the watcher: say so once, as a state
            log.exception("looking at the remote %s failed", self.record.name)
            found = Probe(RemoteState.UNREACHABLE, f"looking at it failed ({type(err).__name__})")
        if found.state is RemoteState.REFUSED and self.record.has_key and self.key_value is None:
            found = Probe(found.state, f"{found.message}; its key could not be read from the keychain")
        self._apply(found)

    def _apply(self, found: Probe) -> None:
        if self.gone:
            return  # removed while being looked at
        old_models = self.models
        if found.models is not None:
            self.models, self.kind, self.version = found.models, found.kind, found.version
        self.failures = 0 if found.state is RemoteState.REACHABLE else self.failures + 1
        if found.state is not self.state:
            self._set_state(found.state, found.message)
        else:
            self.message = found.message
            if self.models != old_models:
                self.emit(RemoteChanged(self.record.name, self.state, self.state, self.message))

    def _set_state(self, state: RemoteState, message: str) -> None:
        """The one place a remote changes state: one event and one log line per move."""
        old = self.state
        assert can_transition(old, state), f"remote {self.record.name}: {old} -> {state}"
        self.state, self.message, self.since = state, message, time.time()
        self.moved.set()
        name, url = self.record.name, self.record.url
        if state is RemoteState.REACHABLE:
            log.info("remote %s (%s) is reachable: %d models", name, url, len(self.models))
        else:
            # Watched (the window, serve), the log tells of the move; a one-shot command prints what its
            # look found itself, and a warning would say it again on stderr.
            level = logging.WARNING if self.watcher is not None else logging.INFO
            log.log(level, "remote %s (%s) is %s: %s", name, url, state.value, message)
        self.emit(RemoteChanged(name, old, state, message))

    # --- its key and connections --------------------------------------------------------------------

    def pool(self) -> httpx.AsyncClient:
        if self.http is None:
            self.http = remote_http.connection_pool(self.record.url)
        return self.http

    async def key(self) -> str | None:
        """Its key, read from the keychain when first needed (None without one)."""
        if not self.key_read:
            if self.record.has_key:
                self.key_value = await asyncio.to_thread(get_remote_key, self.record.name)
            self.key_read = True
        return self.key_value

    async def stop(self) -> None:
        """End its watcher and its look, and close its connections."""
        tasks = [t for t in (self.watcher, self.looking) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.http is not None:
            await self.http.aclose()
            self.http = None
