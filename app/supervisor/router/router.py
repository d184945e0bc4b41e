"""The router's composition: one object for front ends to hold, made of the parts beside it (each
owning its own state) and the verbs they share. It owns the supervisor (engines and backend installs),
the remotes and the MCP servers, passes their events on, and shuts everything down in stages."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

from app.client.chat import ChatClient, Messages
from app.client.events import ChatEvent, ChatReply
from app.core.attachments import TokenCount
from app.core.context import ContextCount, Summary
from app.core.downloads import DownloadRecord
from app.core.engine_state import EngineState
from app.core.errors import LemonDeskError
from app.core.fit import DEFAULT_CONTEXT
from app.core.models import Model
from app.core.policy import RAISE_LIMIT, parse_caps
from app.core.refs import FileSet
from app.core.rpc import LOCAL_ONLY, Endpoint
from app.core.run_record import RunRecord
from app.core.runcard import RunCard
from app.core.telemetry import Telemetry, TelemetryTotals
from app.core.tools import Ask, ToolEvent
from app.store.library import Library
from app.store.model_options import ModelOptions
from app.store.settings import Settings
from app.supervisor.collections import Collections
from app.supervisor.downloads import DownloadManager, DownloadSnapshot
from app.supervisor.engine import Engine
from app.supervisor.hub import HubClient
from app.supervisor.hubsearch import HubResult
from app.supervisor.listeners import Listeners
from app.supervisor.mcp import McpHost
from app.supervisor.orphans import stop_orphans
from app.supervisor.remotes import Remotes
from app.supervisor.resume import Resume
from app.supervisor.router.backends import Backends
from app.supervisor.router.catalog import Catalog
from app.supervisor.router.context import Context
from app.supervisor.router.discover import Discover, Suggestion
from app.supervisor.router.engines import Engines
from app.supervisor.router.events import Dialect, Listener, RequestFinished, RequestSource, RouterEvent
from app.supervisor.router.loading import Loading
from app.supervisor.router.pulls import Pulls
from app.supervisor.router.recovery import Recovery
from app.supervisor.router.requests import Requests
from app.supervisor.router.runtime import Runtime
from app.supervisor.router.tool_support import ToolSupportCheck
from app.supervisor.router.tools import ToolLoop
from app.supervisor.router.usage import Usage
from app.supervisor.router.views import ModelView, Views
from app.supervisor.router.worker import Workers
from app.supervisor.rpc import Worker
from app.supervisor.supervisor import (
    EngineStateChanged,
    InstallProgress,
    LoadOptions,
    Supervisor,
    SupervisorEvent,
)


class Router:
    """The one owner of what runs: the window (through the bridge), the tray, the CLI and the local API
    are front ends over it and call the same methods. Every event reaches subscribers as a plain
    dataclass on the loop thread. asyncio only, no Qt."""

    def __init__(
        self,
        settings: Settings,
        *,
        library: Library | None = None,
        clock: Callable[[], float] = time.monotonic,
        raise_limit: str = RAISE_LIMIT,
    ) -> None:
        self.settings = settings
        self.raise_limit = raise_limit  # how the front end's user raises max_loaded_models, for a refusal
        self.library = library or Library(settings)
        self._listeners: Listeners[RouterEvent] = Listeners("the router")
        self._runtime = Runtime(self._emit)
        self.warnings = [*self.library.warnings, *([self._runtime.warning] if self._runtime.warning else [])]
        self._closing = False
        self._started: asyncio.Future[list[RunRecord]] | None = None
        self.supervisor = Supervisor(
            settings,
            resolve_model=lambda m: self.library.location(m),
            resolve_projector=lambda m: self._discover.projector(m),
            clean_start=False,  # start() does it: a front end that only reads stops nothing
        )
        self._unsubscribe = [self.supervisor.subscribe(self._on_supervisor)]
        settings_now, library_now, closing = (
            (lambda: self.settings),
            (lambda: self.library),
            (lambda: self._closing),
        )
        # Other machines' servers, whose models are named @NAME/MODEL (app.supervisor.remotes).
        self.remotes = Remotes(
            self._emit, timeouts=lambda: (self.settings.load_timeout_s, self.settings.request_timeout_s)
        )
        self.warnings += self.remotes.warnings
        # MCP servers whose tools chats may call (app.supervisor.mcp); none runs until mcp.start().
        self.mcp = McpHost(self._emit)
        self.warnings += self.mcp.warnings
        self._pulls = Pulls(library_now, self._runtime, lambda: self.supervisor.hardware, self.warnings)
        self._discover = Discover(library_now, self.supervisor, self._pulls, self._runtime)
        self._loading = Loading(
            settings=settings_now,
            library=library_now,
            supervisor=self.supervisor,
            runtime=self._runtime,
            pulls=self._pulls,
            clock=clock,
            raise_limit=raise_limit,
            closing=closing,
            started=self.start,
        )
        self._recovery = Recovery(self.supervisor, self._runtime, self._loading.launch, clock, closing)
        self._requests = Requests(
            settings=settings_now,
            supervisor=self.supervisor,
            runtime=self._runtime,
            loading=self._loading,
            remotes=self.remotes,
            resume=Resume(lambda: self.settings.kv_cache_budget_gb),
            clock=clock,
        )
        self._tools = ToolLoop(
            stream=self._requests.stream_chat,
            host=lambda: self.mcp,
            settings=settings_now,
            support=ToolSupportCheck(self._requests, self._runtime, library_now),
        )
        self._context = Context(
            library=library_now,
            supervisor=self.supervisor,
            runtime=self._runtime,
            loading=self._loading,
            requests=self._requests,
            tools=lambda servers: [tool.to_openai() for tool in self.mcp.offered(servers)],
        )
        self._views = Views(
            library_now, self.supervisor, self._runtime, self._pulls, self._discover, self.pinned
        )
        self._usage = Usage(self.supervisor, self._emit, closing)
        self._workers = Workers(self.supervisor, settings_now, self._emit, self.start)
        # The read-only faces front ends use instead of the supervisor and the library.
        self.catalog = Catalog(library_now)
        self.engines = Engines(self.supervisor, self._runtime)
        self.backends = Backends(self.supervisor, settings_now)

    async def start(self) -> None:
        """Stop the engines an earlier run left running (once; later calls wait for that one). Every
        launch awaits it first, so a front end that only reads (``lemon-desk models``) never does it."""
        if self._started is None:
            self._started = asyncio.ensure_future(asyncio.to_thread(stop_orphans))
        await asyncio.shield(self._started)

    async def __aenter__(self) -> Router:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    @functools.cached_property
    def collections(self) -> Collections:
        """Named sets of models with their options: save, load under the policy, export, import."""
        return Collections(self)

    # --- events ---------------------------------------------------------------------------------------

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(event)`` for every event, on the loop; returns the unsubscribe function."""
        return self._listeners.add(listener)

    def _emit(self, event: RouterEvent) -> None:
        self._listeners.emit(event)

    def _on_supervisor(self, event: SupervisorEvent) -> None:
        self._emit(event)
        if isinstance(event, InstallProgress):
            self._loading.install_progress(str(event.key), event.done, event.total or 0)
        elif isinstance(event, EngineStateChanged):
            self._recovery.engine_changed(event)

    # --- options, pins and facts ----------------------------------------------------------------------

    def options(self, name: str) -> ModelOptions:
        return self._runtime.options(name)

    def save_options(self, name: str, options: ModelOptions) -> None:
        """Keep a model's recipe options for every later load (its pin stays as it is)."""
        self._runtime.store_options(name, options)

    def set_pinned(self, name: str, pinned: bool) -> None:
        """Pinned, never evicted or unloaded when idle; saved (a pin a load set for itself gives way)."""
        self._runtime.store_pin(self.library.resolve(name).name, pinned)

    def pinned(self, name: str) -> bool:
        """As its running load asked (``load(pinned=...)``), else as saved."""
        return self._loading.pinned(name)

    def last_used(self, name: str) -> float | None:
        """When a loaded model was last loaded or asked, as a Unix time; None when it is not loaded."""
        return self._requests.last_used(name)

    def busy(self, name: str) -> bool:
        """Whether requests to the model are in flight."""
        return self._requests.busy(name)

    def streaming(self, name: str) -> bool:
        """Whether a reply of the model is streaming to its reader (its first token went out)."""
        return self._requests.streaming(name)

    @contextlib.contextmanager
    def reply_streaming(self, name: str) -> Iterator[None]:
        """Mark a reply of ``name`` as streaming for as long as the block runs."""
        with self._requests.reply_streaming(name):
            yield

    @contextlib.asynccontextmanager
    async def request_slot(self, name: str, prompt: str = "") -> AsyncIterator[int | None]:
        """The engine slot a request without a chat (the local API's) to ``name``'s running engine goes
        to, held while the block runs: one no chat holds first (the one whose cache starts as ``prompt``,
        its ``resume.prompt_key``, does), else the least recently used chat's, saved first
        (``app.supervisor.resume``). None: llama-server chooses (an engine that does not resume)."""
        async with self._requests.request_slot(name, prompt) as slot:
            yield slot

    def load_options(self, name: str) -> LoadOptions | None:
        """The options a running model was loaded with (None when it is not loaded)."""
        return self.engines.launched_with(name)

    def engine_state(self, name: str) -> EngineState | None:
        return self.engines.state(name)

    def loaded(self) -> list[str]:
        """Models whose engine is ready, least recently used first."""
        return self._loading.loaded()

    @property
    def last_request(self) -> RequestFinished | None:
        return self._requests.last_request

    @property
    def totals(self) -> TelemetryTotals:
        """Over every reply since the router started."""
        return self._requests.totals

    # --- views and discovery --------------------------------------------------------------------------

    def statuses(self) -> list[ModelView]:
        """Every model with its status; reads the cache, so front ends on the loop call it in a thread."""
        return self._views.statuses()

    def status(self, name: str) -> ModelView:
        return self._views.status(name)

    async def measure_fit(self, name: str) -> None:
        """Read a model's header from the Hub (a Range read, once) so that its fit counts the KV cache."""
        await self._discover.measure_fit(name)

    async def suggestion(self, context: int = DEFAULT_CONTEXT) -> Suggestion | None:
        """The model a first run offers, its size from the Hub and the Hub's speed measured on its header."""
        return await self._discover.suggestion(context, self._views.fit_of)

    async def search_hub(
        self, query: str, recipe: str | None = None, limit: int = 10, context: int = DEFAULT_CONTEXT
    ) -> list[HubResult]:
        """Hugging Face search: each hit's variants with their sizes and fit at ``context``."""
        return await self._discover.search_hub(query, recipe, limit, context)

    def labels(self, model: Model) -> tuple[str, ...]:
        """A model's labels less what its quirks strip; reads a header."""
        return self._discover.labels(model)

    def projector(self, model: Model) -> Path | None:
        """The vision projector a model loads with (``--mmproj``), None without; reads the disk."""
        return self._discover.projector(model)

    def local_parameter_count(self, model: Model) -> int | None:
        """A model's parameters from its files on disk (None: unknown); reads files (call it in a thread)."""
        return self._discover.local_parameter_count(model)

    # --- downloads ------------------------------------------------------------------------------------

    async def hub(self) -> HubClient:
        return await self._pulls.hub()

    def downloads(self) -> DownloadManager:
        return self._pulls.downloads()

    _cap = property(lambda self: self._pulls.cap)  # read by tests/unit/test_bandwidth_cap.py

    def register(self, model: Model) -> Model:
        """Register a user model defined from outside (Lemonade's ``models/register``), downloading
        nothing; a name defined otherwise is refused (``Library.define``). Returns it as kept."""
        return self._pulls.register(model)

    async def plan_pull(self, name_or_ref: str | Model, recipe: str | None = None) -> tuple[Model, FileSet]:
        """The model and the files a download of it needs (asks the Hub; downloads nothing)."""
        return await self._pulls.plan_pull(name_or_ref, recipe)

    async def download(self, model: Model, files: FileSet) -> DownloadRecord:
        """Fetch ``files`` for ``model`` into the cache (joining a download of it under way)."""
        return await self._pulls.download(model, files)

    async def add(self, ref: str) -> Model:
        """Register a Hub reference as a model and start its download, without waiting for it."""
        return await self._pulls.add(ref)

    async def pull(self, name_or_ref: str | Model, recipe: str | None = None) -> DownloadRecord:
        """The one pull: the CLI's, the window's and the API's."""
        return await self._pulls.pull(name_or_ref, recipe)

    async def pause_download(self, name: str) -> None:
        await self._pulls.pause(name)

    async def resume_download(self, name: str) -> None:
        await self._pulls.resume(name)

    async def cancel_download(self, name: str, *, keep_partial: bool = False) -> None:
        """Stop a download and delete its partial files (``keep_partial``: keep them)."""
        await self._pulls.cancel(name, keep_partial=keep_partial)

    def download_snapshots(self) -> list[DownloadSnapshot]:
        """Every download the app remembers, with speed and ETA; reads files (call it in a thread)."""
        return self._pulls.snapshots()

    def download_records(self) -> list[DownloadRecord]:
        """Every download remembered, as the download manager has it (empty before ``open_downloads``)."""
        return list((self._pulls.records() or {}).values())

    async def open_downloads(self) -> list[str]:
        """Resume the downloads the app's last run left unfinished; returns the names of those resumed."""
        return await self._pulls.open()

    # --- loading and unloading ------------------------------------------------------------------------

    def load(
        self,
        model: str | Model,
        options: ModelOptions | None = None,
        *,
        force: bool = False,
        pinned: bool | None = None,
    ) -> asyncio.Task[Engine]:
        """Load a model under the policy, downloading it and installing its backend first when needed
        (one ``LoadProgress`` per phase; a load of it under way is replaced; cancelled, nothing is left
        half made). ``force`` skips the fit check; ``pinned``: for this load alone (None: as saved)."""
        return self._loading.load(model, options, force, pinned)

    def reload_without(self, name: str, workers: tuple[str, ...]) -> asyncio.Task[Engine]:
        """Load a model again on its last load's RPC workers less ``workers`` (none left: here alone)."""
        return self._loading.reload_without(name, workers)

    def cancel_load(self, name: str) -> bool:
        return self._loading.cancel_load(name)

    async def unload(self, name: str) -> None:
        """Stop a model's engine (cancelling its load or restart); a remote model's remote unloads it."""
        await self._requests.unload(name)

    async def unload_all(self) -> None:
        await self._loading.unload_all()

    async def unload_idle(self) -> list[str]:
        """Unload every unpinned model without a request for ``idle_unload_minutes`` (0: never)."""
        return await self._loading.unload_idle()

    async def delete(self, name: str) -> str:
        """Unload a model and delete its files; returns what was done, for people."""
        return await self._loading.delete(name)

    # --- requests -------------------------------------------------------------------------------------

    async def ensure_loaded(self, name: str) -> Engine:
        """The model's ready engine, loading it (one-click) under the policy when it is not loaded."""
        return await self._requests.ensure_loaded(name)

    @contextlib.asynccontextmanager
    async def client(self, name: str) -> AsyncIterator[ChatClient]:
        """A client for the model's engine (or its remote), loaded on demand; used while it is open."""
        async with self._requests.client(name) as client:
            yield client

    def request_finished(
        self, name: str, telemetry: Telemetry, source: RequestSource, dialect: Dialect | None = None
    ) -> None:
        """Note a finished reply's figures (the last one is kept) and tell the front ends; an API
        request's ``dialect`` tags it and its run card."""
        self._requests.request_finished(name, telemetry, source, dialect)

    def stream_chat(
        self, name: str, messages: Messages, *, conversation: str | None = None, **params: Any
    ) -> AsyncIterator[ChatEvent]:
        """A streamed reply; an engine that dies mid-reply ends it with an EngineError naming the cause.
        ``conversation``: the chat's id; its turns keep to one engine slot, and a llama.cpp model's
        unload saves that slot's KV cache, which the chat's next turn restores (``app.supervisor.resume``)."""
        return self._requests.stream_chat(name, messages, conversation=conversation, **params)

    async def chat(
        self, name: str, messages: Messages, *, conversation: str | None = None, **params: Any
    ) -> ChatReply:
        """A whole reply. One broken by an engine crash is sent once more after the restart."""
        return await self._requests.chat(name, messages, conversation=conversation, **params)

    def chat_with_tools(
        self,
        name: str,
        messages: Messages,
        *,
        ask: Ask,
        servers: Collection[str] | None = None,
        conversation: str | None = None,
        first_round: Mapping[str, Any] | None = None,
        **params: Any,
    ) -> AsyncIterator[ChatEvent | ToolEvent]:
        """A streamed reply that may call the tools of the ready MCP servers (those in ``servers``, when
        given): each call asks first through ``ask`` unless allowed always, runs, and its result goes back
        to the model, which continues (``app.supervisor.router.tools``). A model that cannot call tools
        gets none, and a ``ToolsWithheld`` first says why. ``first_round``: fields for its first request
        alone (a forced call). For the window and ``run``; the local API uses ``stream_chat``."""
        return self._tools.chat(
            name,
            messages,
            ask=ask,
            servers=servers,
            conversation=conversation,
            first_round=first_round,
            **params,
        )

    async def count_tokens(self, name: str, text: str) -> TokenCount:
        """``text``'s tokens by ``name``'s running engine (llama-server's ``/tokenize``) and the context
        ``count_context`` counts against; an estimate (``exact`` False) when it cannot count. Never loads
        the model."""
        return await self._context.count_text(name, text)

    async def embed(self, name: str, texts: list[str]) -> list[list[float]]:
        """``texts`` embedded by an embeddings model (loaded on demand under the loading policy)."""
        return await self._requests.embed(name, texts)

    async def retrieve(self, name: str, text: str, question: str, budget: int) -> tuple[tuple[int, int], ...]:
        """The [start, end) chunks of ``text`` most related to ``question`` by the embeddings model
        ``name``, at most ``budget`` characters, in the text's order."""
        return await self._requests.retrieve(name, text, question, budget)

    def run_card(self, name: str, params: dict[str, Any], telemetry: Telemetry, restored: int = 0) -> RunCard:
        """What produced a reply of ``name``'s engine, for the reply's run card; ``restored``: the
        tokens its turn resumed from disk (``ChatDone.restored``)."""
        return self._requests.run_card(name, params, telemetry, restored)

    # --- the context a chat takes (app.core.context) -------------------------------------------------

    async def count_context(
        self, name: str, messages: Messages, params: dict[str, Any], servers: Collection[str] = ()
    ) -> ContextCount | None:
        """What ``messages`` take of ``name``'s context, with ``params``' max_tokens kept for the reply
        and the tools of the MCP servers ``servers`` offered (as ``chat_with_tools`` offers them):
        counted by a running llama.cpp engine's own tokenizer, else estimated (and labelled so); when
        they do not fit, the ways out. Never loads a model; None for a remote's model."""
        return await self._context.count(name, messages, params, servers)

    def reload_with_context(self, name: str, ctx_size: int) -> asyncio.Task[Engine]:
        """Keep ``ctx_size`` as the model's context option and load it again with it, and otherwise
        as it runs now (the normal load: its fit check and policy hold). ``run``'s flags (``--args``,
        ``--backend``) are its load's, not the saved options: the reload keeps them, and saves none."""
        saved = dataclasses.replace(self.options(name), ctx_size=ctx_size)
        self.save_options(name, saved)
        options = saved
        if (launched := self.engines.launched_with(name)) is not None:
            rpc = ",".join(launched.rpc) or LOCAL_ONLY  # the workers it runs on, none as none
            options = dataclasses.replace(saved, backend=launched.backend, args=launched.args, rpc=rpc)
        record = self._runtime.get(name)
        # A file run where it is (``run FILE``) is in no catalog: its last load knows it.
        return self.load(record.model if record is not None and record.model else name, options)

    async def summarize(self, name: str, messages: Messages, params: dict[str, Any]) -> Summary:
        """A summary of the chat ``messages`` written by ``name``, for a new chat to start with; it says
        how many of the oldest messages it was written without, when the whole chat did not fit."""
        return await self._context.summarize(name, messages, params)

    def chat_target(self, selected: str, on_disk: Collection[str]) -> str:
        """The model a message meant for ``selected`` goes to (else the one used last; "": none).
        ``on_disk``: the models on disk as the front end last read them (no disk is read here)."""
        return self._requests.chat_target(selected, on_disk)

    def failure_message(self, name: str, err: LemonDeskError) -> str:
        """What a failed reply of ``name`` tells its reader: ``err``, with the engine's last words."""
        return self._requests.failure_message(name, err)

    _restarts = property(lambda self: self._runtime.restarts())  # read by tests/unit/test_router.py

    # --- this machine's RPC worker --------------------------------------------------------------------

    @property
    def worker(self) -> Worker | None:
        return self._workers.worker

    async def start_worker(
        self, endpoint: Endpoint, backend: str | None = None, threads: int | None = None
    ) -> Worker:
        """Run an RPC worker from this machine's llama.cpp backend until shutdown or ``sync_worker``."""
        return await self._workers.start(endpoint, backend, threads)

    async def sync_worker(self) -> None:
        """Run this machine's worker as the Settings say: started, moved, or stopped."""
        await self._workers.sync()

    # --- usage samples --------------------------------------------------------------------------------

    def sample_usage(self, on: bool) -> None:
        """Sample every engine's CPU and memory (``EngineUsage`` events) while ``on``."""
        self._usage.sample_usage(on)

    async def system_stats(self) -> dict[str, Any]:
        """The local API's ``GET system-stats``."""
        return await self._usage.system_stats()

    def watch_system(self, on: bool) -> None:
        """A ``SystemSample`` event every second while ``on``; off, nothing is sampled at all."""
        self._usage.watch_system(on)

    @property
    def watching_system(self) -> bool:
        return self._usage.watching_system

    # Read by the tests that check sampling stops (tests/gui/test_engine_ui.py, tests/unit/test_sampler.py).
    _sampler = property(lambda self: self._usage.sampler)
    _sampling = property(lambda self: self._usage.sampling)
    _watcher = property(lambda self: self._usage.watcher)

    # --- settings and shutdown ------------------------------------------------------------------------

    def apply_settings(self, settings: Settings) -> None:
        """Take new settings at once (caps, idle unload, models folder, mirror, timeouts): no restart."""
        parse_caps(settings.max_loaded_models)  # a bad value is refused before anything changes
        old, self.settings = self.settings, settings
        self.supervisor.apply_settings(settings)
        if settings.models_dir != old.models_dir:
            self.library = Library(settings)
            self._pulls.folder_changed()
        self._loading.settings_changed()
        self._runtime.changed()

    async def shutdown(self, resume_downloads: bool = False) -> None:
        """Cancel every load, restart and background job, pause downloads, stop every engine.
        ``resume_downloads``: the paused downloads go on at the next ``open_downloads`` (the window's)."""
        self._closing = True
        jobs: list[asyncio.Future[Any]] = [*self._loading.jobs(), *self._usage.stop()]
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        await self._workers.stop()
        await self.mcp.shutdown()
        await self.supervisor.shutdown()
        await self.remotes.close()
        await self._pulls.close(resume_later=resume_downloads)
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe = []
