"""Context: how much of a model's context a chat takes, and the ways out when it would not fit
(``app.core.context``): the context a reload could have in the memory free now, how many of the oldest
messages leaving out would take, and a summary the model writes for a new chat.

The one way the app counts tokens: a chat's prompt for the context meter and ``run`` (``count``) and a
file for the attachment tray (``count_text``) are counted by the same engine against the same context
(``_measure``). A llama.cpp engine that is running counts with its own tokenizer, the tools offered with
the chat included; any other engine, or a model not loaded, gets an estimate labelled as one. Counting
never loads a model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.client.chat import Messages
from app.client.tokens import context_size, count_prompt
from app.core.attachments import TokenCount
from app.core.attachments import estimate_tokens as estimate_text
from app.core.context import (
    SUMMARY_REQUEST,
    ContextCount,
    CountSource,
    Summary,
    droppable,
    estimate_tokens,
    larger_context,
    reply_share,
    without_oldest,
)
from app.core.engine_state import EngineState
from app.core.errors import LemonDeskError, ModelError
from app.core.fit import largest_context, memory_budget
from app.core.launch import DEFAULT_CTX_SIZE
from app.core.remotes import is_remote_model
from app.platform import free_memory
from app.store.library import Library
from app.store.model_paths import local_shape
from app.supervisor.engine import Engine, launched_ctx_size
from app.supervisor.router.loading import Loading
from app.supervisor.router.requests import Requests
from app.supervisor.router.runtime import Runtime
from app.supervisor.supervisor import Supervisor

log = logging.getLogger(__name__)

Counter = Callable[[Messages], Awaitable[int]]
Tools = Callable[[Collection[str]], list[dict[str, Any]]]  # the servers' tools, as a model is offered them


@dataclass(frozen=True)
class _Measure:
    """What a count of ``name`` is made against: its context, and the engine that counts (None: an
    estimate)."""

    context: int
    engine: Engine | None = None  # a running llama.cpp engine whose tokenizer answers
    assumed: bool = False  # the context is DEFAULT_CTX_SIZE, said by neither the engine nor the model


class Context:
    def __init__(
        self,
        *,
        library: Callable[[], Library],
        supervisor: Supervisor,
        runtime: Runtime,
        loading: Loading,
        requests: Requests,
        tools: Tools,
    ) -> None:
        self._library = library
        self._supervisor = supervisor
        self._runtime = runtime
        self._loading = loading
        self._requests = requests
        self._tools = tools

    async def count(
        self, name: str, messages: Messages, params: dict[str, Any], servers: Collection[str] = ()
    ) -> ContextCount | None:
        """``messages`` (with ``params``' max_tokens kept for the reply, and the tools of ``servers``
        offered) against ``name``'s context, and the ways out when they do not fit; None for a remote's
        model, whose context is not known here."""
        if is_remote_model(name):
            return None
        measure = await self._measure(name)
        tools = self._tools(servers) if servers else []
        reply = reply_share(params)
        counter: Counter = _estimator(tools)
        source = CountSource.ESTIMATE
        if measure.engine is not None:
            counter, source = _tokenizer(measure.engine, tools), CountSource.TOKENIZER
        context, assumed = measure.context, measure.assumed
        used = await counter(messages)
        count = ContextCount(used, context, reply, source, assumed=assumed)
        if count.fits:
            return count
        larger = larger_context(context, count.needed, await self.largest_context(name))
        leave_out = await _leave_out(messages, reply, context, counter)
        return ContextCount(used, context, reply, source, larger, leave_out, assumed)

    async def count_text(self, name: str, text: str) -> TokenCount:
        """``text``'s tokens (an attached file's) as ``count`` counts for ``name``: by its running llama.cpp
        engine's tokenizer (``/tokenize``), else an estimate, with the context ``count`` measures against
        (None for a remote's model)."""
        if is_remote_model(name):
            return estimate_text(text)
        measure = await self._measure(name)
        if measure.engine is not None:
            try:
                async with measure.engine.chat_client() as client:
                    answer = await client.post_json("/tokenize", {"content": text, "add_special": False})
                tokens = answer.get("tokens") if isinstance(answer, dict) else None
                if isinstance(tokens, list):
                    return TokenCount(len(tokens), exact=True, context=measure.context)
                log.warning("%s's engine sent no tokens for /tokenize: counted by length", name)
            except LemonDeskError as err:
                log.warning("%s's engine could not count tokens (%s): counted by length", name, err)
        return dataclasses.replace(estimate_text(text), context=measure.context)

    async def _measure(self, name: str) -> _Measure:
        """``name``'s context and who counts against it: a running llama.cpp engine (its context per slot,
        as it says), else the context it runs with or would load with, counted by estimate."""
        engine = self._supervisor.engines.get(name)
        if engine is None or engine.state is not EngineState.READY:
            return await self._planned_context(name)
        launched = launched_ctx_size(engine)
        if engine.request.recipe == "llamacpp":
            try:
                async with engine.chat_client() as client:
                    return _Measure(await context_size(client), engine)
            except LemonDeskError as err:
                log.info("%s cannot count tokens (%s): estimated instead", name, err)
        return _Measure(launched) if launched else await self._planned_context(name)

    async def _planned_context(self, name: str) -> _Measure:
        """The context ``name`` is (or would be) loaded with: its last launch's, else its options', else
        llama.cpp's launch default, else what the model says it was trained for (an MLX engine takes
        that when it is given none), else an assumed default."""
        record = self._runtime.get(name)
        launched = record.launched_with if record is not None else None
        if launched is not None and launched.ctx_size:
            return _Measure(launched.ctx_size)
        if size := self._runtime.options(name).ctx_size:
            return _Measure(size)
        try:
            model = record.model if record is not None and record.model else self._library().resolve(name)
            local = self._library().local_files(model)
        except ModelError:
            return _Measure(DEFAULT_CTX_SIZE, assumed=True)
        if model.recipe == "llamacpp":
            return _Measure(DEFAULT_CTX_SIZE)  # what plan_launch gives it
        trained = await asyncio.to_thread(_trained_context, model.recipe, local.main if local else None)
        return _Measure(trained) if trained else _Measure(DEFAULT_CTX_SIZE, assumed=True)

    async def largest_context(self, name: str) -> int | None:
        """The largest context ``name`` could be loaded with in the memory free now, its own engine's
        memory counted as free (a reload stops it first); None: unknown, or none fits."""
        library, record = self._library(), self._runtime.get(name)
        try:
            # Its last load's model first: a file run where it is (``run FILE``) is in no catalog.
            model = record.model if record is not None and record.model else library.resolve(name)
            local = library.local_files(model)
            if local is None:
                return None
            shape = await asyncio.to_thread(local_shape, model.recipe, local.main)
        except ModelError as err:
            log.info("no larger context known for %s: %s", name, err)
            return None
        hardware = self._supervisor.hardware
        budget = memory_budget(hardware, model.recipe)
        free = await asyncio.to_thread(free_memory, budget.kind, hardware)
        if free is None:
            return None
        return largest_context(local.size, shape, free + self._loading.rss(name), model.recipe)

    async def summarize(self, name: str, messages: Messages, params: dict[str, Any]) -> Summary:
        """A summary of the chat ``messages``, written by ``name``, of what fits its context: when the
        whole chat does not, its oldest messages are left out of the request until it does, and the
        summary says how many (``Summary.left_out``)."""
        asked = [*messages, {"role": "user", "content": SUMMARY_REQUEST}]
        count = await self.count(name, asked, params)
        left_out = 0
        if count is not None and not count.fits and count.leave_out:
            left_out = count.leave_out
            asked = without_oldest(asked, left_out)
        reply = await self._requests.chat(name, asked, **params)
        return Summary(reply.content.strip(), left_out)


def _trained_context(recipe: str, main: Path | None) -> int:
    """The context the model says it was trained for (0: it does not say, or cannot be read)."""
    if main is None:
        return 0
    try:
        return local_shape(recipe, main).context_train
    except ModelError:
        return 0


def _tokenizer(engine: Engine, tools: Sequence[dict[str, Any]]) -> Counter:
    extra = {"tools": list(tools)} if tools else {}

    async def counted(messages: Messages) -> int:
        async with engine.chat_client() as client:
            return await count_prompt(client, {"messages": list(messages), **extra})

    return counted


def _estimator(tools: Sequence[dict[str, Any]]) -> Counter:
    async def estimated(messages: Messages) -> int:
        return estimate_tokens(messages, tools)

    return estimated


async def _leave_out(messages: Messages, reply: int, context: int, counter: Counter) -> int:
    """The fewest oldest messages whose leaving out makes ``messages`` fit (0: none does), found by
    bisection: each try is one count."""
    low, high = 1, droppable(messages)

    async def fits(count: int) -> bool:
        return ContextCount(
            await counter(without_oldest(messages, count)), context, reply, CountSource.ESTIMATE
        ).fits

    if high < low or not await fits(high):
        return 0
    while low < high:
        middle = (low + high) // 2
        if await fits(middle):
            high = middle
        else:
            low = middle + 1
    return low
