"""Requests: a client for a model's engine (loaded on demand), chat with one replay after a crash, run
cards and request accounting (in flight, streaming, last use, totals).

This is the one place that decides whether a name is a local model or a remote one (``@NAME/MODEL``,
served by ``app.supervisor.remotes``); every verb that could go either way asks here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import shlex
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection, Iterator
from typing import Any, cast

from app.client.chat import ChatClient, Messages
from app.client.events import ChatDone, ChatEvent, ChatReply
from app.core.attachments import chunk_spans, cosine, pick_spans
from app.core.bench import hardware_summary, known_version
from app.core.engine_state import EngineState
from app.core.errors import EngineError, LemonDeskError, RequestError
from app.core.hardware import Hardware
from app.core.launch import DEFAULT_CTX_SIZE
from app.core.remotes import is_remote_model
from app.core.runcard import RunCard, figures, quant_of
from app.core.telemetry import Telemetry, TelemetryTotals
from app.store.settings import Settings
from app.supervisor.engine import Engine
from app.supervisor.remotes import Remotes
from app.supervisor.resume import Resume, Turn, resumable
from app.supervisor.router.events import Dialect, RequestFinished, RequestSource
from app.supervisor.router.loading import Loading
from app.supervisor.router.runtime import Runtime
from app.supervisor.supervisor import Supervisor

log = logging.getLogger(__name__)

LAST_WORDS = 8  # engine output lines a failed reply quotes when its error does not
EMBED_BATCH = 16  # chunks per embeddings request


def is_remote(name: str) -> bool:
    """Whether ``name`` is served by a remote (``@NAME/MODEL``) rather than by an engine here."""
    return is_remote_model(name)


class Requests:
    def __init__(
        self,
        *,
        settings: Callable[[], Settings],
        supervisor: Supervisor,
        runtime: Runtime,
        loading: Loading,
        remotes: Remotes,
        resume: Resume,
        clock: Callable[[], float],
    ) -> None:
        self._settings = settings
        self._supervisor = supervisor
        self._runtime = runtime
        self._loading = loading
        self._remotes = remotes
        self._resume = resume
        self._clock = clock
        self.last_request: RequestFinished | None = None
        self.totals = TelemetryTotals()  # over every reply since the router started

    # --- accounting -----------------------------------------------------------------------------------

    def last_used(self, name: str) -> float | None:
        """When a loaded model was last loaded or asked, as a Unix time; None when it is not loaded."""
        used = self._loading.used(name)
        return None if used is None else time.time() - (self._clock() - used)

    def busy(self, name: str) -> bool:
        record = self._runtime.get(name)
        return record is not None and record.busy > 0

    def streaming(self, name: str) -> bool:
        record = self._runtime.get(name)
        return record is not None and record.streaming > 0

    @contextlib.contextmanager
    def reply_streaming(self, name: str) -> Iterator[None]:
        """Mark a reply of ``name`` as streaming for as long as the block runs."""
        record = self._runtime[name]
        record.streaming += 1
        try:
            yield
        finally:
            record.streaming -= 1

    def request_finished(
        self, name: str, telemetry: Telemetry, source: RequestSource, dialect: Dialect | None = None
    ) -> None:
        """Note a finished reply's figures (the last one is kept) and tell the front ends; an API
        request's (``dialect``) comes with its run card, tagged with the dialect."""
        card = None
        if dialect is not None:
            card = dataclasses.replace(self.run_card(name, {}, telemetry), dialect=dialect.value)
        self.last_request = RequestFinished(name, source, telemetry, dialect, card)
        self.totals = self.totals.add(telemetry)
        self._runtime.emit(self.last_request)

    # --- local or remote ------------------------------------------------------------------------------

    def chat_target(self, selected: str, on_disk: Collection[str]) -> str:
        """The model a message meant for ``selected`` goes to: that one when it can answer (on disk, or
        loaded, here; a remote's model its remote lists), else the model used last ("" when none)."""
        if is_remote(selected):
            usable = self._remotes.model(selected) is not None
        else:
            engine = self._supervisor.engines.get(selected)
            usable = selected in on_disk or (engine is not None and engine.state is EngineState.READY)
        if selected and usable:
            return selected
        loaded = self._loading.loaded()
        return loaded[-1] if loaded else ""

    def failure_message(self, name: str, err: LemonDeskError) -> str:
        """What a reply of ``name`` that failed with ``err`` tells its reader: the error, and the engine's
        last words when the error does not quote them already."""
        message = str(err)
        if isinstance(err, EngineError) and err.last_output:
            return message  # quoted as they were when the engine died
        engine = None if is_remote(name) else self._supervisor.engines.get(name)
        words = engine.last_output(LAST_WORDS) if engine is not None else ""
        if not words or words in message:
            return message
        return f"{message}\n\nThe engine's last words:\n{words}"

    async def unload(self, name: str) -> None:
        """Stop a model's engine; a remote model is unloaded by its remote."""
        if is_remote(name):
            await self._remotes.unload(name)
        else:
            await self._loading.unload(name)

    async def ensure_loaded(self, name: str) -> Engine:
        """The model's ready engine, loading it (one-click) under the policy when it is not loaded."""
        engine = self._supervisor.engines.get(name)
        if engine is not None and engine.state is EngineState.READY:
            self._loading.touch(name)
            return engine
        record = self._runtime.get(name)
        pending = (record.restart or record.load) if record is not None else None
        return await asyncio.shield(pending or self._loading.load(name, None, False, None))

    @contextlib.asynccontextmanager
    async def client(self, name: str) -> AsyncIterator[ChatClient]:
        """A client for the model's engine, loaded on demand; the model counts as used while it is open.
        A remote model (``@NAME/MODEL``) gets a client pointed at its remote."""
        if is_remote(name):
            async with self._remotes.client(name) as remote:
                yield remote
            return
        engine = await self.ensure_loaded(name)
        record = self._runtime[name]
        record.busy += 1
        self._loading.touch(name)
        try:
            async with engine.chat_client(self._settings().request_timeout_s) as client:
                yield client
        finally:
            record.busy -= 1
            self._loading.touch(name)

    async def _turn(self, name: str, conversation: str | None, params: dict[str, Any]) -> Turn:
        """A chat's turn keeps to its engine slot, resumed from its saved KV cache after a reload
        (``app.supervisor.resume``); other requests go as they are."""
        engine = self._supervisor.engines.get(name)
        if conversation is None or engine is None or is_remote(name):
            return Turn(params)
        return await self._resume.turn(engine, conversation, params)

    @contextlib.asynccontextmanager
    async def request_slot(self, name: str, prompt: str = "") -> AsyncIterator[int | None]:
        """The slot a request without a chat goes to on ``name``'s running engine, held while the block
        runs (None: none is chosen here); ``prompt``: its ``resume.prompt_key``."""
        engine = None if is_remote(name) else self._supervisor.engines.get(name)
        if engine is None:
            yield None
            return
        async with self._resume.request_slot(engine, prompt) as slot:
            yield slot

    async def stream_chat(
        self, name: str, messages: Messages, *, conversation: str | None = None, **params: Any
    ) -> AsyncIterator[ChatEvent]:
        """A streamed reply. An engine that dies mid-reply ends it with an EngineError naming the cause
        (the engine restarts behind it; a stream cannot be replayed without the user seeing it twice).
        ``conversation``: the chat's id, which keeps its prompt cache across turns and unloads."""
        async with self.client(name) as client:
            turn = await self._turn(name, conversation, params)
            # Closing the generator closes the HTTP stream, which stops the engine generating.
            stream = cast(AsyncGenerator[ChatEvent, None], client.stream_chat(messages, **turn.params))
            async with contextlib.aclosing(stream):
                with contextlib.ExitStack() as marks:
                    marked = False
                    async for event in stream:
                        if not marked:  # streaming from its first event on
                            marks.enter_context(self.reply_streaming(name))
                            marked = True
                        if isinstance(event, ChatDone):
                            self.request_finished(name, event.telemetry, RequestSource.CHAT)
                            event = dataclasses.replace(event, restored=turn.restored)
                        yield event

    async def chat(
        self, name: str, messages: Messages, *, conversation: str | None = None, **params: Any
    ) -> ChatReply:
        """A whole reply. One broken by an engine crash is sent once more after the restart."""
        try:
            async with self.client(name) as client:
                reply = await client.chat(messages, **(await self._turn(name, conversation, params)).params)
        except EngineError:
            record = self._runtime.get(name)
            restart = record.restart if record is not None else None
            if restart is None:
                raise
            log.info("replaying a request to %s after its engine restarts", name)
            await asyncio.shield(restart)
            async with self.client(name) as client:
                reply = await client.chat(messages, **(await self._turn(name, conversation, params)).params)
        self.request_finished(name, reply.telemetry, RequestSource.CHAT)
        return reply

    async def embed(self, name: str, texts: list[str]) -> list[list[float]]:
        """``texts`` embedded by ``name`` (a model labelled ``embeddings``, loaded on demand), in order;
        a RequestError when its engine's answer is not a list of vectors, one per text."""
        async with self.client(name) as client:
            answer = await client.post_json("/v1/embeddings", {"input": texts})
        rows = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(rows, list) or len(rows) != len(texts):
            raise RequestError(f"{name}'s engine did not answer an embedding for each text.")
        try:
            ordered = sorted(rows, key=lambda row: int(row["index"]))
            return [[float(x) for x in row["embedding"]] for row in ordered]
        except (KeyError, TypeError, ValueError):
            raise RequestError(f"{name}'s engine sent embeddings that are no lists of numbers.") from None

    async def retrieve(self, name: str, text: str, question: str, budget: int) -> tuple[tuple[int, int], ...]:
        """The chunks of ``text`` most related to ``question`` by ``name``'s embeddings (cosine), as
        [start, end) spans in the text's order, at most ``budget`` characters in all."""
        spans = chunk_spans(text)
        vectors: list[list[float]] = []
        for i in range(0, len(spans), EMBED_BATCH):
            vectors += await self.embed(name, [text[start:end] for start, end in spans[i : i + EMBED_BATCH]])
        (query,) = await self.embed(name, [question])
        return pick_spans(spans, [cosine(query, vector) for vector in vectors], budget)

    def run_card(self, name: str, params: dict[str, Any], telemetry: Telemetry, restored: int = 0) -> RunCard:
        """What produced a reply of ``name``'s engine: its model, engine, options, sampling, hardware
        and figures, for the reply's run card; ``restored``: the prompt tokens its turn restored from
        disk (``ChatDone.restored``)."""
        if is_remote(name):
            return dataclasses.replace(self._remotes.run_card(name, params, telemetry), resumes=False)
        engine = self._supervisor.engines.get(name)
        record = self._runtime.get(name)
        model = record.model if record is not None else None
        request = engine.request if engine is not None else None
        checkpoint = model.checkpoint if model is not None else (request.model if request else "")
        return RunCard(
            model=name,
            checkpoint=checkpoint,
            quant=quant_of(checkpoint),
            recipe=request.recipe if request else "",
            backend=request.backend if request else "",
            engine_version=known_version(record.version if record is not None else ""),
            ctx_size=request.ctx_size or (DEFAULT_CTX_SIZE if request.recipe == "llamacpp" else None)
            if request
            else None,
            extra_args=shlex.join(request.user_args) if request else "",
            sampling={k: v for k, v in params.items() if isinstance(v, int | float | str)},
            hardware=_hardware_line(engine.hardware) if engine is not None else "",
            **figures(telemetry),
            restored_tokens=restored,
            resumes=engine is not None and resumable(engine),
        )


@functools.lru_cache(maxsize=4)
def _hardware_line(hardware: Hardware) -> str:
    """``hardware_summary`` of an engine's hardware, worked out once: it does not change, and a run card
    is made for every reply of the API's."""
    return hardware_summary(hardware.to_json())
