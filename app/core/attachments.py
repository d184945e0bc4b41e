"""Attachments: files and images a user message carries, and what a model is sent for them.

A file (text, Markdown, code, CSV, JSON, the text layer of a PDF) goes as context, in a block of the
message's text that names it; an image goes as an OpenAI ``image_url`` part (a data URL), for a model
with a vision projector only. An attachment is kept once, by the SHA-256 of what is kept
(``app.store.attachments``): a file's text (a PDF's text layer, not its pages), an image as the model
is sent it (downscaled). A message refers to it by that hash; ``AttachmentRef`` is that reference.

Nothing is cut silently: a file that does not fit the context is sent only when the user chose to send
the part that fits (``AttachmentRef.sent_chars``) or the parts most related to the question, found by
retrieval with an embeddings model (``AttachmentRef.sent_spans``: chunks of ``CHUNK_CHARS`` ranked by
cosine similarity to the question), and the message then says which.
"""

from __future__ import annotations

import base64
import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

SHA256_HEX = re.compile(r"[0-9a-f]{64}")
CHARS_PER_TOKEN = 4  # the estimate when no engine can count: English text and code average near 4
IMAGE_TOKENS_ESTIMATE = 256  # what a small projector makes of an image, for the estimate of a message
REPLY_RESERVE = 512  # tokens of context kept for the reply when no reply length is set
# What a chat template adds to a request (SmolLM2's default system prompt alone is about 20 tokens), and
# a file's heading and fence: counted on top of the texts, which the estimate of the chat leaves out.
PROMPT_OVERHEAD = 64
ATTACHMENT_OVERHEAD = 24
PART_MARGIN = 0.95  # the part that fits is cut by its share of the count: tokens are not spread evenly
CHUNK_CHARS = 1200  # a retrieval chunk: about 300 tokens, within an embeddings engine's batch (512)
CHUNK_OVERLAP = 150  # characters a chunk shares with the one before: a sentence cut at a border is whole
MAX_IMAGE_SIDE = 896  # px: larger images are scaled down (SmolVLM, Qwen2.5-VL and Gemma 3 take 384-896)

_TEXT_NAMES = """
    txt text log md markdown rst csv tsv json jsonl yaml yml toml ini cfg conf xml html htm css py pyi js
    mjs ts tsx jsx c h cc cpp hpp cs java kt go rs rb php swift m mm scala sh bash zsh fish ps1 sql r jl
    lua pl hs ex exs erl dart vue svelte tex diff patch gitignore dockerfile env
"""
TEXT_SUFFIXES = frozenset(f".{suffix}" for suffix in _TEXT_NAMES.split())
PDF_SUFFIX = ".pdf"
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp"})


class AttachmentKind(enum.Enum):
    TEXT = "text"  # a document or code file, kept as its text and sent as context
    IMAGE = "image"  # a picture, kept as sent (downscaled) and sent as an image_url part


@dataclass(frozen=True)
class AttachmentRef:
    """A message's reference to a kept attachment."""

    sha256: str  # of the bytes kept (app.store.attachments)
    name: str  # the file's name when it was attached, for people
    kind: AttachmentKind
    mime: str  # of the bytes kept: text/plain; charset=utf-8, image/png, image/jpeg
    size: int  # bytes kept
    sent_chars: int | None = None  # TEXT: only the first this many characters go (the part that fits)
    sent_spans: tuple[tuple[int, int], ...] | None = None  # TEXT: only these [start, end) go (retrieval)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "sha256": self.sha256,
            "name": self.name,
            "kind": self.kind.value,
            "mime": self.mime,
            "size": self.size,
        }
        if self.sent_chars is not None:
            data["sent_chars"] = self.sent_chars
        if self.sent_spans is not None:
            data["sent_spans"] = [list(span) for span in self.sent_spans]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AttachmentRef:
        """ValueError for anything the app did not write."""
        sha, name, mime, size = data.get("sha256"), data.get("name"), data.get("mime"), data.get("size")
        sent = data.get("sent_chars")
        if not isinstance(sha, str) or not SHA256_HEX.fullmatch(sha):
            raise ValueError("no SHA-256")
        if not isinstance(name, str) or not isinstance(mime, str):
            raise ValueError("no name or type")
        if not isinstance(size, int) or size < 0 or (sent is not None and not isinstance(sent, int)):
            raise ValueError("no size")
        spans = data.get("sent_spans")
        if spans is not None:
            if not isinstance(spans, list) or not all(
                isinstance(s, list) and len(s) == 2 and all(isinstance(i, int) for i in s) for s in spans
            ):
                raise ValueError("spans that are no [start, end] pairs")
            spans = tuple((s[0], s[1]) for s in spans)
        return cls(sha, name, AttachmentKind(data.get("kind")), mime, size, sent, spans)

    def partial(self, chars: int) -> AttachmentRef:
        return replace(self, sent_chars=chars, sent_spans=None)

    def retrieved(self, spans: tuple[tuple[int, int], ...]) -> AttachmentRef:
        return replace(self, sent_chars=None, sent_spans=spans)


class Unreadable(enum.Enum):
    MISSING = "missing"  # its file is gone from the app's folder
    DAMAGED = "damaged"  # its file no longer has the bytes its hash names


@dataclass(frozen=True)
class TokenCount:
    tokens: int
    exact: bool  # counted by the engine's tokenizer; False: estimated from the length
    context: int | None = None  # the model's context size, when known

    def label(self) -> str:
        return f"{self.tokens:,} tokens" if self.exact else f"≈{self.tokens:,} tokens (estimate)"


def estimate_tokens(text: str) -> TokenCount:
    return TokenCount(max(1, -(-len(text) // CHARS_PER_TOKEN)) if text else 0, exact=False)


def kind_of(name: str) -> AttachmentKind | None:
    """What a file of this name is attached as; None for a type the app does not take."""
    suffix = "." + name.rsplit(".", 1)[-1].lower() if "." in name else ""
    if suffix in IMAGE_SUFFIXES:
        return AttachmentKind.IMAGE
    if suffix in TEXT_SUFFIXES or suffix == PDF_SUFFIX or name.lower() in {"makefile", "dockerfile"}:
        return AttachmentKind.TEXT
    return None


def looks_binary(data: bytes) -> bool:
    """Bytes that are no text: a NUL, or (in the first 8 KiB) not UTF-8 or many control characters."""
    head = data[:8192]
    if b"\0" in head:
        return True
    try:
        text = head.decode()
    except UnicodeDecodeError as err:
        if err.start < len(head) - 3:  # (a character cut by the 8 KiB edge is still text)
            return True
        text = head[: err.start].decode()
    controls = sum(1 for c in text if ord(c) < 32 and c not in "\t\n\r\f\v\x1b")
    return controls > max(8, len(text) // 100)


@dataclass(frozen=True)
class Fit:
    """How an attached text fits what the model can take: ``over`` tokens too many, and the characters
    of it that fit (a proportion of its length: the engine counted the whole, not each prefix)."""

    over: int
    fitting_chars: int


def fit_in_context(count: TokenCount, chars: int, room: int) -> Fit | None:
    """None when ``count`` fits in ``room`` tokens; else how much does not, and what part does."""
    if count.tokens <= room:
        return None
    share = max(room, 0) / count.tokens if count.tokens else 0.0
    return Fit(count.tokens - max(room, 0), int(chars * share * PART_MARGIN))


def chunk_spans(text: str, size: int = CHUNK_CHARS, overlap: int = CHUNK_OVERLAP) -> list[tuple[int, int]]:
    """``text`` in chunks of about ``size`` characters, [start, end) each, ending at a line's end where
    one is in the chunk's second half, each overlapping the one before by ``overlap``."""
    spans: list[tuple[int, int]] = []
    start = 0
    while start < len(text):
        end = min(len(text), start + size)
        if end < len(text) and (cut := text.rfind("\n", start + size // 2, end)) != -1:
            end = cut + 1
        spans.append((start, end))
        if end == len(text):
            break
        start = max(end - overlap, start + 1)
    return spans


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norms = sum(x * x for x in a) ** 0.5 * sum(y * y for y in b) ** 0.5
    return dot / norms if norms else 0.0


def pick_spans(
    spans: Sequence[tuple[int, int]], scores: Sequence[float], budget: int
) -> tuple[tuple[int, int], ...]:
    """The best-scored spans whose characters fit ``budget``, in the text's order, overlaps merged."""
    chosen: list[tuple[int, int]] = []
    used = 0
    for i in sorted(range(len(spans)), key=lambda i: -scores[i]):
        start, end = spans[i]
        if used + end - start <= budget:
            chosen.append((start, end))
            used += end - start
    merged: list[tuple[int, int]] = []
    for start, end in sorted(chosen):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return tuple(merged)


def context_block(ref: AttachmentRef, text: str) -> str:
    """A file as the model reads it: named, fenced, and said to be a part when it is one."""
    if ref.sent_spans is not None:
        sent = sum(end - start for start, end in ref.sent_spans)
        head = (
            f"Attached file {ref.name} (only {len(ref.sent_spans)} parts of it, {sent:,} of {len(text):,}"
            " characters: those most related to the question, found by retrieval)"
        )
        text = "\n[…]\n".join(text[start:end] for start, end in ref.sent_spans)
    elif ref.sent_chars is not None and ref.sent_chars < len(text):
        head = (
            f"Attached file {ref.name} (only its first {ref.sent_chars:,} of {len(text):,} characters:"
            " the part that fits the context)"
        )
        text = text[: ref.sent_chars]
    else:
        head = f"Attached file {ref.name}"
    fence = "````" if "```" in text else "```"
    return f"{head}:\n{fence}\n{text}\n{fence}"


def unreadable_note(ref: AttachmentRef, why: Unreadable) -> str:
    """What stands for an attachment that can no longer be read, in the transcript and to the model."""
    if why is Unreadable.MISSING:
        return f"{ref.name}: the attachment's file is missing from the app's folder."
    return f"{ref.name}: the attachment's file is damaged (its content no longer matches what was attached)."


def image_part(mime: str, data: bytes) -> dict[str, Any]:
    url = f"data:{mime};base64,{base64.b64encode(data).decode()}"
    return {"type": "image_url", "image_url": {"url": url}}


def message_content(
    text: str, attachments: Sequence[tuple[AttachmentRef, bytes | Unreadable]]
) -> str | list[dict[str, Any]]:
    """A user message's OpenAI content: its text with each file's block after it, then its images as
    ``image_url`` parts (a plain string when it has no image)."""
    blocks, images = [], []
    for ref, data in attachments:
        if isinstance(data, Unreadable):
            blocks.append(f"[{unreadable_note(ref, data)}]")
        elif ref.kind is AttachmentKind.IMAGE:
            images.append(image_part(ref.mime, data))
        else:
            blocks.append(context_block(ref, data.decode(errors="replace")))
    body = "\n\n".join([text, *blocks]) if text else "\n\n".join(blocks)
    if not images:
        return body
    return [{"type": "text", "text": body}, *images] if body else images


def vision_refusal(model: str, sees: bool, seeing: Sequence[str]) -> str:
    """ "" when ``model`` takes images; else why not, naming a model that can (``seeing``: the library's
    and the catalog's vision models, those on disk first)."""
    if sees:
        return ""
    who = model or "No model is chosen, so the message"
    why = (
        f"{who} cannot take images: it has no vision projector (mmproj)."
        if model
        else f"{who} cannot take images."
    )
    if seeing:
        return f"{why} {seeing[0]} can: choose it in the Models list to send pictures."
    return f"{why} Add a model with a vision projector (labelled vision) to send pictures."
