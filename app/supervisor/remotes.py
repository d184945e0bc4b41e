"""Remote servers as backends: ``Remotes``, owned by the router, keeps the collection (``remote.Remote``
is one remote: its state, its looks, its key and connections).

A remote is another machine's OpenAI-compatible server (another Lemon Desk, a Lemonade Server, or any
such server), kept in ``<home>/remotes.json`` with its key in the keychain. Its models are named
``@NAME/MODEL``; a request for one gets the app's ``ChatClient`` pointed at the remote's root, with its
key and the remote's own model id, so the router's chat, the CLI's ``run`` and the local API use it as
they use a local engine, and the reply's telemetry is measured here on the client.

Health: while watched (the window and ``serve`` watch; one-shot commands look once), each remote has a
task that asks for its model list every ``poll_s`` while it answers, and with a backoff (``backoff_s``)
while it does not. Each move between states (``app.core.remotes.RemoteState``; ``Remote._set_state`` is
the one place that makes them) is one ``RemoteChanged`` event and one log line: a remote that stays down
is one "unreachable", never a stream of errors. A request to a remote not known to answer looks once more
first, and a request that breaks looks at once, so a remote that comes back is used again without
waiting for the next look, and one that went away is said to be unreachable at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from app.client import remote as remote_http
from app.client.chat import ChatClient
from app.client.remote import RemoteAdapter
from app.core.errors import ConfigError, LemonDeskError, ModelError, RemoteError, RequestError, StorageError
from app.core.remotes import (
    RemoteKind,
    RemoteModelInfo,
    RemoteRef,
    RemoteState,
    check_remote_name,
    normalise_url,
    parse_remote_model,
)
from app.core.runcard import RunCard, figures, quant_of
from app.core.telemetry import Telemetry
from app.store.remotes import RemoteRecord, load_remotes, remotes_path, save_remotes
from app.store.saving import saving
from app.store.secrets import delete_remote_key, set_remote_key
from app.supervisor.remote import Remote
from app.supervisor.remote_views import RemoteChanged, RemoteModelView, RemoteSnapshot

log = logging.getLogger(__name__)

POLL_S = 15.0  # between looks at a remote that answers
LOOK_DEADLINE_S = 15.0  # a look that takes longer (an answer dripping in) finds the remote unreachable
BACKOFF_S = (2.0, 5.0, 10.0, 30.0)  # after the 1st, 2nd, 3rd, 4th+ look in a row that found it down
FILE_POLL_S = 2.0  # how often a watching app looks whether another process changed the remotes file


def _file_stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes when the remotes file is written (atomically: a new inode), or None without one."""
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns, info.st_size


class _Observer:
    """Watches the replies of one remote: a reply that breaks makes the remote be looked at at once."""

    def __init__(self, remotes: Remotes, remote: Remote) -> None:
        self._remotes = remotes
        self._remote = remote

    def request_started(self) -> None:
        return None

    def data_received(self) -> None:
        return None

    def request_finished(self) -> None:
        return None

    async def explain(self, error: RequestError) -> LemonDeskError:
        remote = self._remote
        await self._remotes.look(remote, since=time.monotonic())  # a look begun before the failure saw
        # the remote before it failed
        return error if remote.state is RemoteState.REACHABLE else remote.unreachable()


# --- the component ----------------------------------------------------------------------------------


class Remotes:
    """Every remote: its state, model list and watcher; clients, loads and unloads for its models."""

    def __init__(
        self,
        emit: Callable[[RemoteChanged], None],
        *,
        timeouts: Callable[[], tuple[float, float]] = lambda: (600.0, 300.0),
        poll_s: float = POLL_S,
        backoff_s: tuple[float, ...] = BACKOFF_S,
        look_deadline_s: float = LOOK_DEADLINE_S,
        file_poll_s: float = FILE_POLL_S,
    ) -> None:
        """``timeouts``: the settings' load and request timeouts, read at each use."""
        self._emit = emit
        self._timeouts = timeouts
        self.poll_s = poll_s
        self.backoff_s = backoff_s
        self.look_deadline_s = look_deadline_s
        self.file_poll_s = file_poll_s
        self._file = remotes_path()  # looked at every FILE_POLL_S: the path is worked out once
        self._file_stamp = _file_stamp(self._file)
        loaded = load_remotes()
        self.warnings = [loaded.warning] if loaded.warning else []
        self._remotes = {name: Remote(record, emit) for name, record in loaded.items.items()}
        self._watching = False
        self._closed = False
        self._file_watcher: asyncio.Task[None] | None = None
        self._changing = asyncio.Lock()  # an add or removal here, or taking in one made elsewhere

    # --- reading ------------------------------------------------------------------------------------

    def names(self) -> list[str]:
        return sorted(self._remotes)

    def snapshots(self) -> list[RemoteSnapshot]:
        return [self._remotes[name].snapshot() for name in self.names()]

    def snapshot(self, name: str) -> RemoteSnapshot:
        return self._get(name).snapshot()

    def views(self) -> list[RemoteModelView]:
        """Every remote model with its status, remote by remote."""
        return [view for snapshot in self.snapshots() for view in snapshot.views()]

    def _get(self, name: str) -> Remote:
        remote = self._remotes.get(name)
        if remote is None:
            raise ModelError(
                f"There is no remote named {name!r}.",
                "`lemon-desk remote list` shows them; add one with `lemon-desk remote add NAME URL` "
                "or in Settings > Connections > Remotes.",
            )
        return remote

    # --- adding and removing ------------------------------------------------------------------------

    async def add(self, name: str, url: str, key: str | None) -> RemoteSnapshot:
        """Keep a new remote (its key in the keychain), look at it once, and watch it when watching.
        A remote that does not answer now is kept all the same: it may answer later."""
        check_remote_name(name)
        record = RemoteRecord(name, normalise_url(url), has_key=bool(key))
        async with self._changing:
            if name in self._remotes:
                existing = self._remotes[name].record.url
                raise ConfigError(
                    f"There is already a remote named {name} ({existing}).",
                    f"Remove it first (`lemon-desk remote rm {name}`), or choose another name.",
                )
            if key:
                await asyncio.to_thread(set_remote_key, name, key)
            records = {n: r.record for n, r in self._remotes.items()} | {name: record}
            try:
                with saving("the remotes"):
                    await asyncio.to_thread(save_remotes, records)
            except StorageError:
                if key:
                    await asyncio.to_thread(delete_remote_key, name)
                raise
            self._file_stamp = _file_stamp(self._file)
            remote = self._adopt(record, key)
        await self.look(remote)
        return remote.snapshot()

    def _adopt(self, record: RemoteRecord, key: str | None = None) -> Remote:
        """Keep a remote just added (here, or by another process with ``key`` in the keychain)."""
        remote = Remote(record, self._emit, key_value=key or None, key_read=key is not None)
        self._remotes[record.name] = remote
        log.info("remote %s added: %s", record.name, record.url)
        self._emit(RemoteChanged(record.name, RemoteState.UNKNOWN, RemoteState.UNKNOWN))
        if self._watching:
            self._start_watcher(remote)
        return remote

    async def remove(self, name: str) -> None:
        """Forget a remote and delete its key from the keychain."""
        async with self._changing:
            remote = self._get(name)
            records = {n: r.record for n, r in self._remotes.items() if n != name}
            with saving("the remotes"):
                await asyncio.to_thread(save_remotes, records)
            self._file_stamp = _file_stamp(self._file)
            try:  # the key goes before anyone is told the remote has: nothing can read it after that
                if remote.record.has_key:
                    await asyncio.to_thread(delete_remote_key, name)
            finally:
                await self._forget(name)

    async def _forget(self, name: str) -> None:
        remote = self._remotes.pop(name)
        remote.gone = True
        await remote.stop()
        log.info("remote %s removed", name)
        self._emit(RemoteChanged(name, remote.state, remote.state, removed=True))

    async def _watch_file(self) -> None:
        """Take in the remotes another process (``lemon-desk remote add`` or ``rm``) added or removed."""
        while True:
            await asyncio.sleep(self.file_poll_s)
            async with self._changing:
                stamp = _file_stamp(self._file)
                if stamp == self._file_stamp:
                    continue
                self._file_stamp = stamp
                loaded = await asyncio.to_thread(load_remotes)
                if loaded.warning:  # a file this app cannot read (set aside): keep the remotes it knows
                    log.warning("%s", loaded.warning)
                    # what setting it aside left is no change either
                    self._file_stamp = _file_stamp(self._file)
                    continue
                for name in [n for n, r in self._remotes.items() if loaded.items.get(n) != r.record]:
                    await self._forget(name)  # removed there, or replaced by another of its name
                for name, record in loaded.items.items():
                    if name not in self._remotes:
                        self._adopt(record)  # its watcher looks at it at once

    # --- looking ------------------------------------------------------------------------------------

    def watch(self) -> None:
        """Watch every remote (and those added later) until ``close``."""
        if self._closed:
            return
        self._watching = True
        for remote in self._remotes.values():
            self._start_watcher(remote)
        if self._file_watcher is None:
            self._file_watcher = asyncio.ensure_future(self._watch_file())

    async def refresh(self, names: list[str] | None = None) -> list[RemoteSnapshot]:
        """Look at the remotes (all, or those named) now, together; their snapshots after."""
        chosen = [self._get(n) for n in names] if names is not None else list(self._remotes.values())
        await asyncio.gather(*(self.look(r) for r in chosen))
        return [r.snapshot() for r in chosen]

    def _start_watcher(self, remote: Remote) -> None:
        if remote.watcher is None or remote.watcher.done():
            remote.watcher = asyncio.ensure_future(self._watch(remote))

    async def _watch(self, remote: Remote) -> None:
        while True:
            await self.look(remote)
            await self._rest(remote)

    async def _rest(self, remote: Remote) -> None:
        """Wait the delay the remote's state asks for. A move meanwhile (a request's look found it gone,
        or back) starts the delay of the new state: a remote found down is looked at on the backoff's
        schedule from then on, not after the rest of a 15-second wait."""
        while True:
            remote.moved.clear()
            try:
                await asyncio.wait_for(remote.moved.wait(), self._delay(remote))
            except TimeoutError:
                return

    def _delay(self, remote: Remote) -> float:
        if remote.state is RemoteState.REACHABLE:
            return self.poll_s
        return self.backoff_s[min(max(remote.failures, 1), len(self.backoff_s)) - 1]

    async def look(self, remote: Remote, since: float | None = None) -> None:
        """Look at a remote once (``Remote.look``: a look under way is joined unless it began before
        ``since``)."""
        await remote.look(self.look_deadline_s, since)

    # --- using a remote's models --------------------------------------------------------------------

    async def _usable(self, name: str) -> tuple[Remote, RemoteRef]:
        """The remote of ``@NAME/MODEL`` once it is known to answer (looked at now if it was not)."""
        ref = parse_remote_model(name)
        remote = self._get(ref.remote)
        if remote.state is not RemoteState.REACHABLE:
            await self.look(remote)
        if remote.state is RemoteState.REFUSED:
            raise RemoteError(
                f"The remote {ref.remote} ({remote.record.url}) {remote.message.removeprefix('it ')}.",
                f"Give it the right key: `lemon-desk remote rm {ref.remote}`, then `lemon-desk remote add "
                f"{ref.remote} {remote.record.url} --ask-key` (or remove and add it in "
                "Settings > Connections > Remotes).",
                remote=ref.remote,
                status=401,
            )
        if remote.state is not RemoteState.REACHABLE:
            raise remote.unreachable()
        return remote, ref

    @contextlib.asynccontextmanager
    async def client(self, name: str) -> AsyncIterator[ChatClient]:
        """A client for ``@NAME/MODEL``: the remote's root, its key, the model's id there."""
        remote, ref = await self._usable(name)
        client = ChatClient(
            remote.record.url,
            await remote.key(),
            adapter=RemoteAdapter(ref.model),
            observer=_Observer(self, remote),
            request_timeout_s=self._timeouts()[1],
            http=remote.pool(),
        )
        async with client:
            yield client

    async def load(self, name: str) -> None:
        """Have the remote load the model (Lemon Desk and Lemonade: their ``load``; a plain OpenAI
        server loads models by its own rules, so only its answering is checked)."""
        await self._manage(name, remote_http.load)

    async def unload(self, name: str) -> None:
        await self._manage(name, remote_http.unload)

    async def _manage(self, name: str, verb: Callable[..., Any]) -> None:
        remote, ref = await self._usable(name)
        if remote.kind in (RemoteKind.LEMON_DESK, RemoteKind.LEMONADE):
            await verb(remote.pool(), await remote.key(), ref.model, self._timeouts()[0])
            await self.look(remote)  # its loaded models changed

    async def stats(self, name: str) -> dict[str, Any] | None:
        """The remote's own figures for its last request (Lemon Desk and Lemonade), else None."""
        remote = self._get(parse_remote_model(name).remote)
        if remote.kind not in (RemoteKind.LEMON_DESK, RemoteKind.LEMONADE):
            return None
        return await remote_http.stats(remote.pool(), await remote.key())

    def model(self, name: str) -> RemoteModelView | None:
        """The view of ``@NAME/MODEL`` when its remote listed it (None for any other name)."""
        try:
            ref = parse_remote_model(name)
        except ConfigError:
            return None
        remote = self._remotes.get(ref.remote)
        if remote is None:
            return None
        return next((v for v in remote.snapshot().views() if v.info.id == ref.model), None)

    def run_card(self, name: str, params: dict[str, Any], telemetry: Telemetry) -> RunCard:
        """A remote reply's run card: what the remote said of the model, and the figures measured here."""
        ref = parse_remote_model(name)
        remote = self._remotes.get(ref.remote)
        view = self.model(name)
        info = view.info if view is not None else RemoteModelInfo(ref.model)
        checkpoint = info.checkpoint or ref.model
        kind = remote.kind.value if remote is not None and remote.kind else "remote"
        version = remote.version if remote is not None else ""
        return RunCard(
            model=name,
            checkpoint=checkpoint,
            quant=quant_of(checkpoint),
            recipe=info.recipe or "remote",
            backend=f"{ref.remote} at {remote.record.url}" if remote is not None else ref.remote,
            engine_version=f"({kind} {version})".replace(" )", ")"),
            ctx_size=None,
            extra_args="",
            sampling={k: v for k, v in params.items() if isinstance(v, int | float | str)},
            hardware=f"the remote {ref.remote}'s",
            **figures(telemetry),
        )

    # --- closing ------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop every watcher and close every connection."""
        self._closed, self._watching = True, False
        if self._file_watcher is not None:
            self._file_watcher.cancel()
            await asyncio.gather(self._file_watcher, return_exceptions=True)
        for remote in list(self._remotes.values()):
            await remote.stop()
