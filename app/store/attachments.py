"""Attachments kept by content: ``attachments/<first two hex>/<sha256>`` under the history's folder.

A file is written once (atomically) whatever number of messages and chats refer to it; the chat history
(``app.store.history``) counts those references and removes a file when the last one goes. A file kept
for a message not saved yet is held (``hold``) from before it is written until that message is saved or
dropped (``release``): no reference names it meanwhile, and deleting another chat that used it must not
take it. A kept file is checked against its hash when read: a damaged or missing one is said
(``Unreadable``), not raised.

``ingest`` reads what a user attached (in a worker thread: it reads files and decodes images): a text
file as UTF-8 text (a binary under a text name is refused), a PDF as its text layer (pypdf), an image
scaled down to ``MAX_IMAGE_SIDE`` (Pillow) and kept as PNG or JPEG, which every projector reads.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.attachments import (
    MAX_IMAGE_SIDE,
    PDF_SUFFIX,
    SHA256_HEX,
    TEXT_SUFFIXES,
    AttachmentKind,
    AttachmentRef,
    Unreadable,
    kind_of,
    looks_binary,
    message_content,
)
from app.core.errors import AttachmentError, UnsafePathError
from app.store.files import atomic_write_bytes

MiB = 1 << 20
MAX_FILE_BYTES = 64 * MiB  # a file larger than this is refused before it is read
TEXT_MIME = "text/plain; charset=utf-8"
log = logging.getLogger(__name__)


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class AttachmentStore:
    """Hold and release on the thread that collects (the UI's, as ``History``); ``put`` may run in a
    worker thread once its hash is held."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._held: Counter[str] = Counter()  # hashes kept for messages not saved yet, by holder

    def hold(self, hashes: Iterable[str]) -> None:
        """Keep these from being collected until ``release``: they are for a message on its way."""
        self._held.update(hashes)

    def release(self, hashes: Iterable[str]) -> None:
        """The message they were held for is saved (its references now keep them) or did not go."""
        self._held.subtract(hashes)
        self._held = +self._held  # a hash held no more leaves the count

    def held(self, sha256: str) -> bool:
        return self._held[sha256] > 0

    def path(self, sha256: str) -> Path:
        if not SHA256_HEX.fullmatch(sha256):
            raise UnsafePathError(f"{sha256[:80]!r} is no SHA-256: no attachment has that name.")
        return self.root / sha256[:2] / sha256

    def put(self, data: bytes) -> str:
        """Keep ``data`` (once: an intact copy already kept is left as it is); returns its hash."""
        sha = sha256_of(data)
        if self.read(sha) != data:
            atomic_write_bytes(self.path(sha), data)
        return sha

    def read(self, sha256: str) -> bytes | Unreadable:
        try:
            data = self.path(sha256).read_bytes()
        except FileNotFoundError:
            return Unreadable.MISSING
        except OSError as err:
            log.warning("Could not read attachment %s: %s", sha256, err)
            return Unreadable.DAMAGED
        return data if sha256_of(data) == sha256 else Unreadable.DAMAGED

    def remove(self, sha256: str) -> None:
        path = self.path(sha256)
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the two-hex folder, once empty
            path.parent.rmdir()

    def kept(self) -> set[str]:
        """The hashes of every file kept (the names of files that are hashes)."""
        if not self.root.is_dir():
            return set()
        return {p.name for p in self.root.glob("??/*") if SHA256_HEX.fullmatch(p.name)}


@dataclass(frozen=True)
class Ingested:
    """A file as attached: its reference, the bytes to keep, and where it came from."""

    ref: AttachmentRef
    data: bytes
    source: Path | None  # None: pasted

    @property
    def text(self) -> str:
        return self.data.decode() if self.ref.kind is AttachmentKind.TEXT else ""


_TAKEN = "text, Markdown, code, CSV, JSON, PDF, and images (PNG, JPEG, WebP, GIF, BMP)"


def ingest(path: Path) -> Ingested:
    """Read a file the user attached; AttachmentError says why it cannot be (in words for the user)."""
    name = path.name
    if kind_of(name) is None:
        raise AttachmentError(f"{name} was not attached: the chat takes {_TAKEN}.")
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise AttachmentError(
                f"{name} was not attached: it is {size / MiB:,.0f} MiB, more than the "
                f"{MAX_FILE_BYTES // MiB} MiB a message takes."
            )
        raw = path.read_bytes()
    except FileNotFoundError:
        raise AttachmentError(f"{name} was not attached: it is no longer at {path.parent}.") from None
    except OSError as err:
        raise AttachmentError(f"{name} was not attached: it could not be read ({err.strerror}).") from None
    return ingest_data(name, raw, path)


def ingest_data(name: str, raw: bytes, source: Path | None = None) -> Ingested:
    """What ``ingest`` makes of a file's bytes (a pasted image's too, with no ``source``)."""
    kind = kind_of(name)
    if kind is None:
        raise AttachmentError(f"{name} was not attached: the chat takes {_TAKEN}.")
    if kind is AttachmentKind.IMAGE:
        mime, data = _image(name, raw)
    else:
        pdf = name.lower().endswith(PDF_SUFFIX)
        mime, data = TEXT_MIME, _pdf_text(name, raw) if pdf else _text(name, raw)
    return Ingested(AttachmentRef(sha256_of(data), name, kind, mime, len(data)), data, source)


def still_there(taken: Ingested) -> str:
    """ "" when the file ``taken`` was read from is still there (or it came from no file), else what to
    tell the user: a file that vanished after it was attached is said when the message is sent."""
    if taken.source is None or taken.source.is_file():
        return ""
    return (
        f"{taken.ref.name} is gone from {taken.source.parent} since it was attached. "
        "Remove it from the message, or attach it again from where it is now."
    )


def _text(name: str, raw: bytes) -> bytes:
    if looks_binary(raw):
        raise AttachmentError(
            f"{name} was not attached: its content is binary, not text, whatever its name says.",
            "Attach the document it came from, or a text export of it.",
        )
    return raw.decode(errors="replace").encode()


def _pdf_text(name: str, raw: bytes) -> bytes:
    import pypdf  # on first use: it is not needed before a PDF is attached

    try:
        reader = pypdf.PdfReader(io.BytesIO(raw))
        pages = [page.extract_text() or "" for page in reader.pages]
    except Exception as err:  # a damaged PDF can make the parser raise anything (an IndexError, ...)
        raise AttachmentError(f"{name} was not attached: it is not a readable PDF ({err}).") from None
    text = "\n\n".join(p.strip() for p in pages if p.strip())
    if not text:
        raise AttachmentError(
            f"{name} was not attached: its {len(pages)} pages have no text layer (a scan?).",
            "Attach a PDF with text in it, or run it through text recognition first.",
        )
    return text.encode()


def _image(name: str, raw: bytes) -> tuple[str, bytes]:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(raw)) as image:
            image.load()
            fmt, size = image.format, image.size
            if fmt in ("PNG", "JPEG") and max(size) <= MAX_IMAGE_SIDE:
                return f"image/{fmt.lower()}", raw
            image.thumbnail((MAX_IMAGE_SIDE, MAX_IMAGE_SIDE))
            out = io.BytesIO()
            if image.mode in ("RGBA", "LA", "P"):
                image.convert("RGBA").save(out, "PNG", optimize=True)
                return "image/png", out.getvalue()
            image.convert("RGB").save(out, "JPEG", quality=90)
            return "image/jpeg", out.getvalue()
    except Exception as err:  # a damaged image can make the decoder raise anything (a struct.error, ...)
        raise AttachmentError(
            f"{name} was not attached: it is not an image the app can read ({err})."
        ) from None


def expand_messages(store: AttachmentStore, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages whose ``attachments`` (AttachmentRefs) are read from ``store`` into their content
    (``app.core.attachments.message_content``); one that cannot be read is said in its place."""
    sent = []
    for message in messages:
        refs = message.get("attachments")
        if not refs:
            sent.append(message)
            continue
        content = message_content(message["content"], [(ref, store.read(ref.sha256)) for ref in refs])
        sent.append({k: v for k, v in message.items() if k != "attachments"} | {"content": content})
    return sent


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def export_name(ref: AttachmentRef) -> str:
    """A file name for an exported attachment: the hash's start and the name's safe characters (the
    name came from the user's disk: never a path), with the suffix of what is kept (``.txt`` after a
    PDF kept as its text, ``.jpg`` for an image re-encoded as JPEG)."""
    safe = _UNSAFE.sub("_", ref.name).strip("._")[:80] or "attachment"
    stem, dot, suffix = safe.rpartition(".")
    if not dot:
        stem, suffix = safe, ""
    if ref.kind is AttachmentKind.IMAGE:
        wanted = ".png" if ref.mime == "image/png" else ".jpg"
        return f"{ref.sha256[:12]}-{stem}{wanted}"
    keeps_type = f".{suffix.lower()}" in TEXT_SUFFIXES
    return f"{ref.sha256[:12]}-{safe}" + ("" if keeps_type else ".txt")
