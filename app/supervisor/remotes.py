"""Remote servers as backends: ``Remotes``, owned by the router.

A remote is another machine's OpenAI-compatible server (another Lemon Desk, a Lemonade Server, or any
such server), kept in ``<home>/remotes.json`` with its key in the keychain. Its models are named
``@NAME/MODEL``; a request for one gets the app's ``ChatClient`` pointed at the remote's root, with its
key and the remote's own model id, so the router's chat, the CLI's ``run`` and the local API use it as
they use a local engine, and the reply's telemetry is measured here on the client.

Health: while watched (the window and ``serve`` watch; one-shot commands look once), each remote has a
task that asks for its model list every ``poll_s`` while it answers, and with a backoff (``backoff_s``)
while it does not. Each move between states (``app.core.remotes.RemoteState``; ``_set_state`` is the one
place that makes them) is one ``RemoteChanged`` event and one log line: a remote that stays down is one
"unreachable", never a stream of errors. A request to a remote not known to answer looks once more
first, and a request that breaks looks at once, so a remote that comes back is used again without
waiting for the next look, and one that went away is said to be unreachable at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from app.client import remote as remote_http
from app.client.chat import ChatClient
from app.client.remote import Probe, RemoteAdapter
from app.core.errors import ConfigError, LemonDeskError, ModelError, RemoteError, RequestError
from app.core.remotes import (
    RemoteKind,
    RemoteModelInfo,
    RemoteRef,
    RemoteState,
    can_transition,
    check_remote_name,
    normalise_url,
    parse_remote_model,
)
from app.core.runcard import RunCard, figures, quant_of
from app.core.telemetry import Telemetry
from app.store.remotes import RemoteRecord, load_remotes, remotes_path, save_remotes
from app.store.saving import unsaved
from app.store.secrets import delete_remote_key, get_remote_key, set_remote_key
from app.supervisor.remote_views import RemoteChanged, RemoteModelView, RemoteSnapshot

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

POLL_S = 15.0  # between looks at a remote that answers
LOOK_DEADLINE_S = 15.0  # a look that takes longer (an answer dripping in) finds the remote unreachable
BACKOFF_S = (2.0, 5.0, 10.0, 30.0)  # after the 1st, 2nd, 3rd, 4th+ look in a row that found it down
FILE_POLL_S = 2.0  # how often a watching app looks whether another process changed the remotes file


def _file_stamp() -> tuple[int, int, int] | None:
    """What changes when the remotes file is written (atomically: a new inode), or None without one."""
    try:
        info = remotes_path().stat()
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns, info.st_size


# --- one remote, inside -----------------------------------------------------------------------------


@dataclass(eq=False)
class _Remote:
    record: RemoteRecord
    state: RemoteState = RemoteState.UNKNOWN
    kind: RemoteKind | None = None
    version: str = ""
    message: str = ""
    since: float = field(default_factory=time.time)
    models: tuple[RemoteModelInfo, ...] = ()
    failures: int = 0  # looks in a row that found it down (the backoff's step)
    key: str | None = None
    key_read: bool = False
    http: httpx.AsyncClient | None = None
    watcher: asyncio.Task[None] | None = None
    looking: asyncio.Task[None] | None = None
    looking_since: float = 0.0  # when that look began (monotonic)
    moved: asyncio.Event = field(default_factory=asyncio.Event)  # its state changed (the watcher's rest ends)

    def __repr__(self) -> str:  # never the key
        return f"_Remote({self.record.name}, {self.record.url}, {self.state.name})"

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


class _Observer:
    """Watches the replies of one remote: a reply that breaks makes the remote be looked at at once."""

    def __init__(self, remotes: Remotes, remote: _Remote) -> None:
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
        return error if remote.state is RemoteState.REACHABLE else _unreachable(remote)


def _unreachable(remote: _Remote) -> RemoteError:
    name = remote.record.name
    return RemoteError(
        f"The remote {name} cannot be reached at {remote.record.url}: {remote.message}.",
        f"Check that the server is running and that this machine can reach it (`lemon-desk remote list` "
        f"shows {name}'s state). Lemon Desk keeps looking and uses it again as soon as it answers.",
        remote=name,
    )


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
        self._file_stamp = _file_stamp()
        loaded = load_remotes()
        self.warnings = [loaded.warning] if loaded.warning else []
        self._remotes = {name: _Remote(record) for name, record in loaded.items.items()}
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

    def _get(self, name: str) -> _Remote:
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
                await asyncio.to_thread(save_remotes, records)
            except OSError as err:
                if key:
                    await asyncio.to_thread(delete_remote_key, name)
                raise unsaved("the remotes", err) from None
            self._file_stamp = _file_stamp()
            remote = self._adopt(record, key)
        await self.look(remote)
        return remote.snapshot()

    def _adopt(self, record: RemoteRecord, key: str | None = None) -> _Remote:
        """Keep a remote just added (here, or by another process with ``key`` in the keychain)."""
        remote = _Remote(record, key=key or None, key_read=key is not None)
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
            try:
                await asyncio.to_thread(save_remotes, records)
            except OSError as err:
                raise unsaved("the remotes", err) from None
            self._file_stamp = _file_stamp()
            try:  # the key goes before anyone is told the remote has: nothing can read it after that
                if remote.record.has_key:
                    await asyncio.to_thread(delete_remote_key, name)
            finally:
                await self._forget(name)

    async def _forget(self, name: str) -> None:
        remote = self._remotes.pop(name)
        await self._stop(remote)
        log.info("remote %s removed", name)
        self._emit(RemoteChanged(name, remote.state, remote.state, removed=True))

    async def _watch_file(self) -> None:
        """Take in the remotes another process (``lemon-desk remote add`` or ``rm``) added or removed."""
        while True:
            await asyncio.sleep(self.file_poll_s)
            async with self._changing:
                stamp = _file_stamp()
                if stamp == self._file_stamp:
                    continue
                self._file_stamp = stamp
                loaded = await asyncio.to_thread(load_remotes)
                if loaded.warning:  # a file this app cannot read (set aside): keep the remotes it knows
                    log.warning("%s", loaded.warning)
                    self._file_stamp = _file_stamp()  # what setting it aside left is no change either
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

    def _start_watcher(self, remote: _Remote) -> None:
        if remote.watcher is None or remote.watcher.done():
            remote.watcher = asyncio.ensure_future(self._watch(remote))

    async def _watch(self, remote: _Remote) -> None:
        while True:
            await self.look(remote)
            await self._rest(remote)

    async def _rest(self, remote: _Remote) -> None:
        """Wait the delay the remote's state asks for. A move meanwhile (a request's look found it gone,
        or back) starts the delay of the new state: a remote found down is looked at on the backoff's
        schedule from then on, not after the rest of a 15-second wait."""
        while True:
            remote.moved.clear()
            try:
                await asyncio.wait_for(remote.moved.wait(), self._delay(remote))
            except TimeoutError:
                return

    def _delay(self, remote: _Remote) -> float:
        if remote.state is RemoteState.REACHABLE:
            return self.poll_s
        return self.backoff_s[min(max(remote.failures, 1), len(self.backoff_s)) - 1]

    async def look(self, remote: _Remote, since: float | None = None) -> None:
        """Look at a remote once; looks asked for while one is under way wait for that one. ``since``
        (monotonic): a look under way that began before then does not do, another follows it."""
        while True:
            if remote.looking is None or remote.looking.done():
                remote.looking = asyncio.ensure_future(self._probe(remote))
                remote.looking_since = time.monotonic()
            began = remote.looking_since
            try:
                await asyncio.shield(remote.looking)
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise  # this caller was cancelled; a look stopped by a removal or close is not that
                return
            if since is None or began >= since or remote.record.name not in self._remotes:
                return

    async def _probe(self, remote: _Remote) -> None:
        try:
            key = await self._key(remote)
            found = await asyncio.wait_for(remote_http.probe(self._pool(remote), key), self.look_deadline_s)
        except TimeoutError:
            found = Probe(RemoteState.UNREACHABLE, f"it did not answer within {self.look_deadline_s:g} s")
        except Exception as err:  # a look must never end the watcher: say so once, as a state
            log.exception("looking at the remote %s failed", remote.record.name)
            found = Probe(RemoteState.UNREACHABLE, f"looking at it failed ({type(err).__name__})")
        if found.state is RemoteState.REFUSED and remote.record.has_key and remote.key is None:
            found = Probe(found.state, f"{found.message}; its key could not be read from the keychain")
        self._apply(remote, found)

    def _apply(self, remote: _Remote, found: Probe) -> None:
        if remote.record.name not in self._remotes or self._remotes[remote.record.name] is not remote:
            return  # removed while being looked at
        old_models = remote.models
        if found.models is not None:
            remote.models, remote.kind, remote.version = found.models, found.kind, found.version
        remote.failures = 0 if found.state is RemoteState.REACHABLE else remote.failures + 1
        if found.state is not remote.state:
            self._set_state(remote, found.state, found.message)
        else:
            remote.message = found.message
            if remote.models != old_models:
                self._emit(RemoteChanged(remote.record.name, remote.state, remote.state, remote.message))

    def _set_state(self, remote: _Remote, state: RemoteState, message: str) -> None:
        """The one place a remote changes state: one event and one log line per move."""
        old = remote.state
        assert can_transition(old, state), f"remote {remote.record.name}: {old} -> {state}"
        remote.state, remote.message, remote.since = state, message, time.time()
        remote.moved.set()
        name, url = remote.record.name, remote.record.url
        if state is RemoteState.REACHABLE:
            log.info("remote %s (%s) is reachable: %d models", name, url, len(remote.models))
        else:
            # Watched (the window, serve), the log tells of the move; a one-shot command prints what its
            # look found itself, and a warning would say it again on stderr.
            level = logging.WARNING if self._watching else logging.INFO
            log.log(level, "remote %s (%s) is %s: %s", name, url, state.value, message)
        self._emit(RemoteChanged(name, old, state, message))

    def _pool(self, remote: _Remote) -> httpx.AsyncClient:
        if remote.http is None:
            remote.http = remote_http.connection_pool(remote.record.url)
        return remote.http

    async def _key(self, remote: _Remote) -> str | None:
        if not remote.key_read:
            if remote.record.has_key:
                remote.key = await asyncio.to_thread(get_remote_key, remote.record.name)
            remote.key_read = True
        return remote.key

    # --- using a remote's models --------------------------------------------------------------------

    async def _usable(self, name: str) -> tuple[_Remote, RemoteRef]:
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
            raise _unreachable(remote)
        return remote, ref

    @contextlib.asynccontextmanager
    async def client(self, name: str) -> AsyncIterator[ChatClient]:
        """A client for ``@NAME/MODEL``: the remote's root, its key, the model's id there."""
        remote, ref = await self._usable(name)
        client = ChatClient(
            remote.record.url,
            await self._key(remote),
            adapter=RemoteAdapter(ref.model),
            observer=_Observer(self, remote),
            request_timeout_s=self._timeouts()[1],
            http=self._pool(remote),
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
            await verb(self._pool(remote), await self._key(remote), ref.model, self._timeouts()[0])
            await self.look(remote)  # its loaded models changed

    async def stats(self, name: str) -> dict[str, Any] | None:
        """The remote's own figures for its last request (Lemon Desk and Lemonade), else None."""
        remote = self._get(parse_remote_model(name).remote)
        if remote.kind not in (RemoteKind.LEMON_DESK, RemoteKind.LEMONADE):
            return None
        return await remote_http.stats(self._pool(remote), await self._key(remote))

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

    async def _stop(self, remote: _Remote) -> None:
        tasks = [t for t in (remote.watcher, remote.looking) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if remote.http is not None:
            await remote.http.aclose()
            remote.http = None

    async def close(self) -> None:
        """Stop every watcher and close every connection."""
        self._closed, self._watching = True, False
        if self._file_watcher is not None:
            self._file_watcher.cancel()
            await asyncio.gather(self._file_watcher, return_exceptions=True)
        for remote in list(self._remotes.values()):
            await self._stop(remote)
