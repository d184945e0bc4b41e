"""Context: how much of a model's context a chat takes, and the ways out when it would not fit
(``app.core.context``): the context a reload could have in the memory free now, how many of the oldest
messages leaving out would take, and a summary the model writes for a new chat.

A llama.cpp engine that is running counts with its own tokenizer; any other engine, or a model not
loaded, gets an estimate labelled as one. Counting never loads a model.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from app.client.chat import Messages
from app.client.tokens import context_size, count_prompt
from app.core.context import (
    SUMMARY_REQUEST,
    ContextCount,
    CountSource,
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


class Context:
    def __init__(
        self,
        *,
        library: Callable[[], Library],
        supervisor: Supervisor,
        runtime: Runtime,
        loading: Loading,
        requests: Requests,
    ) -> None:
        self._library = library
        self._supervisor = supervisor
        self._runtime = runtime
        self._loading = loading
        self._requests = requests

    async def count(self, name: str, messages: Messages, params: dict[str, Any]) -> ContextCount | None:
        """``messages`` (with ``params``' max_tokens kept for the reply) against ``name``'s context, and
        the ways out when they do not fit; None for a remote's model, whose context is not known here."""
        if is_remote_model(name):
            return None
        engine = self._supervisor.engines.get(name)
        reply = reply_share(params)
        counter: Counter = _estimate
        source, context = CountSource.ESTIMATE, self._planned_context(name)
        if engine is not None and engine.state is EngineState.READY:
            context = launched_ctx_size(engine) or context
            if engine.request.recipe == "llamacpp":
                try:
                    async with engine.chat_client() as client:
                        context = await context_size(client)
                    counter, source = _tokenizer(engine), CountSource.TOKENIZER
                except LemonDeskError as err:
                    log.info("%s cannot count tokens (%s): estimated instead", name, err)
        used = await counter(messages)
        count = ContextCount(used, context, reply, source)
        if count.fits:
            return count
        larger = larger_context(context, count.needed, await self.largest_context(name))
        leave_out = await _leave_out(messages, reply, context, counter)
        return ContextCount(used, context, reply, source, larger, leave_out)

    def _planned_context(self, name: str) -> int:
        """The context ``name`` is (or would be) loaded with: its last launch's, else its options'."""
        record = self._runtime.get(name)
        launched = record.launched_with if record is not None else None
        if launched is not None and launched.ctx_size:
            return launched.ctx_size
        return self._runtime.options(name).ctx_size or DEFAULT_CTX_SIZE

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

    async def summarize(self, name: str, messages: Messages, params: dict[str, Any]) -> str:
        """A summary of the chat ``messages``, written by ``name``, of what fits its context: the oldest
        messages are left out of the request until it does."""
        asked = [*messages, {"role": "user", "content": SUMMARY_REQUEST}]
        count = await self.count(name, asked, params)
        if count is not None and not count.fits and count.leave_out:
            asked = without_oldest(asked, count.leave_out)
        reply = await self._requests.chat(name, asked, **params)
        return reply.content.strip()


def _tokenizer(engine: Engine) -> Counter:
    async def counted(messages: Messages) -> int:
        async with engine.chat_client() as client:
            return await count_prompt(client, {"messages": list(messages)})

    return counted


async def _estimate(messages: Messages) -> int:
    return estimate_tokens(messages)


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
