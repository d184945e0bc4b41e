"""Instant resume, and the prompt cache kept across turns (llama-server; other engines do neither).

A chat keeps to one engine slot (``id_slot``) with ``cache_prompt``, so each turn processes only what it
adds. When a llama-server engine stops at anyone's request (an explicit unload, an eviction, an idle
unload, the app quitting, a reload with other options), every slot holding a chat is first saved
(``POST /slots/{id}?action=save``) into the store (``app.store.kvcache``); the chat's first turn on a
later engine of the same model file, context, backend and arguments restores it (``action=restore``)
before it is sent, so only the new tokens are processed. A restore is safe even when the chat changed
meanwhile: llama-server reuses only the prefix its cache shares with the new prompt.

Chats and requests without a conversation (the local API's) get slots through the same rule
(``_pick``): a slot no chat holds and no request is using first, then one only requests use (llama-server
queues a request for a busy slot), and when every slot is held by a chat, the least recently used chat's,
saved first (its next turn restores it). So an API request never lands on a chat's slot unseen, and the
only file it can cost a chat is one the disk budget drops, as any save does. A request holds its slot
only while it runs (``request_slot``). Among the slots it may take, a request goes to the one whose last
request's prompt starts as its own does (``prompt_key``: an agent resending a growing conversation, a
script sending one long prefix), else to the least recently used, as llama-server itself would choose: its
prompt cache is reused, and a slot's cache is not overwritten while an older one could be. A crashed
engine saves nothing (its process is gone); its chats start over on the restarted one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.client.chat import ChatClient
from app.core.errors import LemonDeskError
from app.core.launch import DEFAULT_CTX_SIZE
from app.core.units import GB
from app.store.kvcache import SavedSlot, SlotFiles, SlotKey, model_identity
from app.supervisor.engine import Engine, launched_ctx_size

log = logging.getLogger(__name__)


def resumable(engine: Engine) -> bool:
    """Whether the engine saves and restores slots: a llama-server started with ``--slot-save-path``."""
    return engine.request.recipe == "llamacpp" and bool(engine.request.slot_save_path)


@dataclass
class _EngineSlots:
    """What one running engine's slots hold."""

    files: SlotFiles
    count: int  # the engine's slots (llama-server's ``total_slots``)
    model: tuple[str, int, int]  # the model file's identity (``model_identity``)
    held: dict[str, int] = field(default_factory=dict)  # conversation -> slot, least recently used first
    serving: Counter[int] = field(default_factory=Counter)  # slot -> requests without a chat running on it
    prompts: dict[int, str] = field(default_factory=dict)  # slot -> the prompt key of its last request
    used: dict[int, None] = field(default_factory=dict)  # the slots given out, least recently first
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass(frozen=True)
class Turn:
    """What a chat's turn sends, and what its saved KV cache gave it."""

    params: dict[str, Any]  # the request's parameters with ``id_slot`` and ``cache_prompt``
    restored: int = 0  # tokens restored from disk before it (0: none)


class Resume:
    """Slots for chats on every running llama-server, saved when the engine stops, restored after."""

    def __init__(self, budget_gb: Callable[[], float]) -> None:
        """``budget_gb()``: the disk the saved KV caches may take (the ``kv_cache_budget_gb`` setting)."""
        self._budget_gb = budget_gb
        self._engines: weakref.WeakKeyDictionary[Engine, _EngineSlots] = weakref.WeakKeyDictionary()
        self._unreadable: weakref.WeakSet[Engine] = weakref.WeakSet()  # asked once, and they could not say
        self._swept: set[Path] = set()

    def _budget_bytes(self) -> int:
        return int(self._budget_gb() * GB)

    async def turn(self, engine: Engine, conversation: str, params: dict[str, Any]) -> Turn:
        """The parameters for a turn of ``conversation`` on ``engine``: its slot and the prompt cache,
        with its saved KV cache restored first when this engine does not hold the chat yet."""
        if not resumable(engine) or engine in self._unreadable:
            return Turn(params)
        slots = await self._slots(engine)
        if slots is None:
            return Turn(params)
        restored = 0
        async with slots.lock:
            slot = slots.held.pop(conversation, None)
            if slot is None:
                slot = await self._pick(engine, slots)
                restored = await self._restore(engine, slots, slot, conversation)
            slots.held[conversation] = slot
        return Turn({**params, "id_slot": slot, "cache_prompt": True}, restored)

    @contextlib.asynccontextmanager
    async def request_slot(self, engine: Engine, prompt: str = "") -> AsyncIterator[int | None]:
        """The slot a request without a chat (the local API's) goes to on ``engine``, held for as long as
        the block runs (None: this engine's slots are not managed; llama-server chooses). ``prompt``: the
        request's ``prompt_key``, which sends it to a slot whose cache starts as its prompt does."""
        slots = await self._slots(engine) if resumable(engine) and engine not in self._unreadable else None
        if slots is None:
            yield None
            return
        async with slots.lock:
            slot = await self._pick(engine, slots, prompt)
            slots.serving[slot] += 1
            slots.prompts[slot] = prompt
        try:
            yield slot
        finally:
            slots.serving[slot] -= 1
            if slots.serving[slot] <= 0:
                del slots.serving[slot]

    async def _slots(self, engine: Engine) -> _EngineSlots | None:
        slots = self._engines.get(engine)
        if slots is not None:
            return slots
        files = SlotFiles(Path(engine.request.slot_save_path))
        try:
            async with engine.chat_client() as client:
                count = int((await client.get_json("/props"))["total_slots"])
            model = await asyncio.to_thread(model_identity, engine.request.model)
            if files.root not in self._swept:
                self._swept.add(files.root)
                await asyncio.to_thread(files.sweep)
        except (LemonDeskError, OSError, KeyError, TypeError, ValueError) as err:
            log.warning("no saved KV caches for %s: its slots cannot be read (%s)", engine.id, err)
            self._unreadable.add(engine)
            return None
        known = self._engines.get(engine)  # another turn's look came first
        if known is not None:
            return known
        slots = self._engines[engine] = _EngineSlots(files, max(count, 1), model)
        engine.add_stop_hook(self.save_all)
        return slots

    async def _pick(self, engine: Engine, slots: _EngineSlots, prompt: str = "") -> int:
        """A slot no chat holds and no request uses (of those, the one whose last request's prompt shares
        the longest start with ``prompt``, if one shares enough to be worth keeping to, else the least
        recently used), else the one of those only requests use that the fewest use, else the least
        recently used chat's, saved first. A chat's slot (``prompt`` empty) forgets its last request."""
        taken = set(slots.held.values())
        free = [slot for slot in range(slots.count) if slot not in taken]
        if free:
            fewest = min(slots.serving[slot] for slot in free)
            idle = [slot for slot in free if slots.serving[slot] == fewest]
            slot = _best_start(idle, slots.prompts, prompt) if prompt else None
            if slot is None:
                order = {slot: rank for rank, slot in enumerate(slots.used)}
                slot = min(idle, key=lambda slot: order.get(slot, -1))
        else:
            displaced, slot = next(iter(slots.held.items()))
            del slots.held[displaced]
            await self._save(engine, slots, slot, displaced)
        slots.used.pop(slot, None)
        slots.used[slot] = None
        slots.prompts.pop(slot, None)
        return slot

    def _key(self, engine: Engine, slots: _EngineSlots, conversation: str) -> SlotKey:
        request = engine.request
        path, size, mtime = slots.model
        return SlotKey(
            model=path,
            model_size=size,
            model_mtime_ns=mtime,
            ctx_size=launched_ctx_size(engine) or DEFAULT_CTX_SIZE,
            backend=str(request.backend_key),
            engine_args=request.user_args,
            conversation=conversation,
        )

    async def _restore(self, engine: Engine, slots: _EngineSlots, slot: int, conversation: str) -> int:
        """Restore ``conversation``'s saved KV cache into ``slot``; the tokens restored (0: none, or a
        restore the engine refused, which leaves a normal prefill and says so in the log)."""
        key = self._key(engine, slots, conversation)
        saved = await asyncio.to_thread(slots.files.lookup, key)
        if saved is None:
            return 0
        try:
            async with engine.chat_client() as client:
                answer = await _slot_action(client, slot, "restore", saved.filename)
            restored = int(answer.get("n_restored", 0))
        except (LemonDeskError, TypeError, ValueError) as err:
            log.warning(
                "%s refused the saved KV cache of a chat (%s): the prompt is processed again", engine.id, err
            )
            await asyncio.to_thread(slots.files.drop, key.digest)
            return 0
        log.info("%s: resumed %d tokens of a chat from disk into slot %d", engine.id, restored, slot)
        return restored

    async def _save(
        self, engine: Engine, slots: _EngineSlots, slot: int, conversation: str
    ) -> SavedSlot | None:
        """Save ``slot`` as ``conversation``'s KV cache, then hold the folder in the budget."""
        budget = self._budget_bytes()
        if budget <= 0:
            return None
        key = self._key(engine, slots, conversation)
        temporary = slots.files.temporary_name(key)
        saved = None
        try:
            async with engine.chat_client() as client:
                answer = await _slot_action(client, slot, "save", temporary)
            tokens, written = int(answer.get("n_saved", 0)), int(answer.get("n_written", 0))
            if tokens > 0:
                saved = await asyncio.to_thread(slots.files.commit, key, temporary, tokens, written)
        except (LemonDeskError, OSError, TypeError, ValueError) as err:
            log.warning("%s could not save the KV cache of a chat (%s)", engine.id, err)
        finally:
            await asyncio.to_thread(_remove, slots.files, temporary)
        if saved is not None:
            log.info(
                "%s: saved %d tokens of a chat from slot %d (%d bytes)",
                engine.id,
                saved.tokens,
                slot,
                saved.size,
            )
            await asyncio.to_thread(slots.files.enforce, budget)
        return saved

    async def save_all(self, engine: Engine) -> None:
        """The engine's stop hook: save every slot a chat holds, except those replying now (llama-server
        would save them only once the reply ends, and the unload would wait for it)."""
        slots = self._engines.get(engine)
        if slots is None:
            return
        async with slots.lock:
            held, slots.held = slots.held, {}
            busy = await _busy_slots(engine) if held else set()
            for conversation, slot in held.items():
                if slot in busy:
                    log.info("%s: slot %d is replying as it stops; its chat is not saved", engine.id, slot)
                    continue
                await self._save(engine, slots, slot, conversation)


# The start a request's prompt must share with a slot's last one for the slot to be chosen for it: a
# tenth of the prompt, as llama-server's own choice asks (--slot-prompt-similarity), and more than a
# role's name and a few words. Even a one-line prompt is worth keeping to its slot: on these 2-core
# machines, SmolLM2 takes ~38 ms to process one again (tests/bench/serve_overhead.py).
SHARED_SHARE_AT_LEAST = 0.1
SHARED_START_AT_LEAST = 24


def prompt_key(messages: object = None, prompt: object = None, tools: object = None) -> str:
    """A request's prompt as text that starts alike where the engine's prompt does: its tools (a chat
    template puts them first), then each message's role and content, or a completion's prompt."""
    parts = [] if tools is None else [json.dumps(tools, sort_keys=True)]
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, dict):
                content = message.get("content")
                text = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
                rest = {key: value for key, value in message.items() if key not in ("role", "content")}
                extra = json.dumps(rest, sort_keys=True) if rest else ""  # tool calls, a tool's call id
                parts.append(f"{message.get('role')}\n{text}{extra}")
    elif prompt is not None:
        parts.append(prompt if isinstance(prompt, str) else json.dumps(prompt))
    return "\x1e".join(parts)


SHARED_BLOCK = 1 << 16  # characters compared at once (a prompt with an image in it is megabytes long)


def shared_start(a: str, b: str) -> int:
    """How many characters ``a`` and ``b`` share at their start: compared a block at a time, then by
    halves inside the first block that differs (linear in what they share, not a copy of it per step)."""
    end = min(len(a), len(b))
    low = 0
    while low < end and a[low : low + SHARED_BLOCK] == b[low : low + SHARED_BLOCK]:
        low += SHARED_BLOCK
    if low >= end:
        return end
    start, high = low, min(low + SHARED_BLOCK, end)
    while low < high:
        middle = (low + high + 1) // 2
        if a[start:middle] == b[start:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _best_start(candidates: list[int], prompts: dict[int, str], prompt: str) -> int | None:
    """The candidate slot whose last prompt shares the longest start with ``prompt``, if any shares
    enough of it: ``SHARED_SHARE_AT_LEAST`` of it and ``SHARED_START_AT_LEAST`` characters."""
    best, longest = None, max(SHARED_START_AT_LEAST, int(SHARED_SHARE_AT_LEAST * len(prompt))) - 1
    for slot in candidates:
        shared = shared_start(prompts.get(slot, ""), prompt)
        if shared > longest:
            best, longest = slot, shared
    return best


async def _busy_slots(engine: Engine) -> set[int]:
    """The slots processing a request now (none known when llama-server's ``/slots`` cannot say)."""
    try:
        async with engine.chat_client() as client:
            answer = await client.get_json("/slots")
        return {int(slot["id"]) for slot in answer if slot.get("is_processing")}
    except (LemonDeskError, AttributeError, KeyError, TypeError, ValueError) as err:
        log.info("%s: its slots' state is unknown (%s)", engine.id, err)
        return set()


async def _slot_action(client: ChatClient, slot: int, action: str, filename: str) -> dict[str, Any]:
    answer = await client.post_json(f"/slots/{slot}?action={action}", {"filename": filename})
    if not isinstance(answer, dict):
        raise ValueError(f"llama-server's answer to a slot {action} is not an object")
    return answer


def _remove(files: SlotFiles, temporary: str) -> None:
    """What a save left under its temporary name when it was not committed."""
    (files.root / temporary).unlink(missing_ok=True)
