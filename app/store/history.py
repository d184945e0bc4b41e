"""Chat history: conversations and their messages in SQLite under ``LEMON_DESK_HOME``.

The database runs in WAL mode and commits every write at once, so a crash loses at most what the caller
had not yet written: a streaming reply is appended when it starts and updated as it grows (the caller
throttles those updates). Full-text search uses FTS5 when SQLite has it, ``LIKE`` otherwise.
A file that is not a database, or one whose pages are damaged (``PRAGMA quick_check``: tens of ms for
tens of MB, at start), is set aside (kept, never deleted) and a new one is started.

A message's attachments are rows of ``message_attachments`` (schema v4) naming files kept once each by
hash (``app.store.attachments``, beside the database); a file goes when the last row naming it does.

SQLite keeps whatever a damaged file or a hand-edit put in a column (NULL, a blob, text for a time), so
rows are read with care: such text is read as text, such a time as 0, figures or a run card that cannot
be read as none, and a message whose role is neither user nor assistant is left out; each in the log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import re
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from app.core.attachments import AttachmentKind, AttachmentRef
from app.core.chat import MessageState
from app.core.errors import LemonDeskError, StorageError
from app.core.numbers import finite
from app.core.runcard import RunCard
from app.store.attachments import AttachmentStore, export_name
from app.store.files import atomic_write_bytes, set_aside
from app.store.paths import home

P = ParamSpec("P")
R = TypeVar("R")

SCHEMA_VERSION = 5
DEFAULT_TITLE = "New chat"
LEFT_OUT_NOTE = "left out of the model's context: the chat outgrew it"
ROLES = ("user", "assistant")  # what the chat pane keeps; the system prompt is the conversation's
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConversationSummary:
    id: str
    title: str
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class StoredMessage:
    id: int
    role: str  # "user" | "assistant"
    content: str
    reasoning: str = ""
    state: MessageState = MessageState.COMPLETE
    telemetry: dict[str, Any] | None = None
    error: str = ""  # why a FAILED reply failed
    created_at: float = 0.0
    run_card: dict[str, Any] | None = None  # a reply's RunCard fields (app.core.runcard), by name
    tool_calls: tuple[
        dict[str, Any], ...
    ] = ()  # a reply's tool calls, as ToolCallFinished.to_json() has them
    attachments: tuple[AttachmentRef, ...] = ()  # files and images a user message carries
    left_out: bool = False  # left out of what is sent to the model (the chat outgrew its context); kept


@dataclass(frozen=True)
class Conversation:
    id: str
    title: str
    system_prompt: str
    model: str
    created_at: float
    updated_at: float
    messages: list[StoredMessage] = field(default_factory=list)


_SCHEMA_V1 = """
        CREATE TABLE conversations (
            num INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            title TEXT NOT NULL,
            system_prompt TEXT NOT NULL DEFAULT '',
            model TEXT NOT NULL DEFAULT '',
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        );
        CREATE INDEX conversations_by_update ON conversations(updated_at DESC);
        CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            role TEXT NOT NULL,
            content TEXT NOT NULL DEFAULT '',
            reasoning TEXT NOT NULL DEFAULT '',
            state TEXT NOT NULL,
            telemetry TEXT,
            error TEXT NOT NULL DEFAULT '',
            created_at REAL NOT NULL,
            UNIQUE (conversation_id, position)
        );
"""

# v2: a reply's run card (model, engine, options, sampling, hardware, figures) as JSON.
_RUN_CARD_V2 = "ALTER TABLE messages ADD COLUMN run_card TEXT"

# v3: a reply's tool calls (MCP tools run in its turn: name, arguments, outcome, result, time) as JSON.
_TOOL_CALLS_V3 = "ALTER TABLE messages ADD COLUMN tool_calls TEXT"

# v4: the attachments a message refers to (kept once each by hash in app.store.attachments).
_ATTACHMENTS_V4 = """
        CREATE TABLE message_attachments (
            message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            sha256 TEXT NOT NULL,
            ref TEXT NOT NULL,
            PRIMARY KEY (message_id, position)
        );
        CREATE INDEX message_attachments_by_hash ON message_attachments(sha256)
"""

# v5: messages left out of what is sent to the model, when the chat outgrew its context (kept here).
_LEFT_OUT_V5 = "ALTER TABLE messages ADD COLUMN left_out INTEGER NOT NULL DEFAULT 0"

# MIGRATIONS[n] is the SQL that takes a database at schema version n to n + 1.
MIGRATIONS: list[str] = [_SCHEMA_V1, _RUN_CARD_V2, _TOOL_CALLS_V3, _ATTACHMENTS_V4, _LEFT_OUT_V5]

_FTS_SCHEMA = """
CREATE VIRTUAL TABLE messages_fts USING fts5(content, reasoning, content='messages', content_rowid='id');
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content, reasoning) VALUES (new.id, new.content, new.reasoning);
END;
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content, reasoning)
    VALUES ('delete', old.id, old.content, old.reasoning);
END;
CREATE TRIGGER messages_fts_update AFTER UPDATE OF content, reasoning ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content, reasoning)
    VALUES ('delete', old.id, old.content, old.reasoning);
    INSERT INTO messages_fts(rowid, content, reasoning) VALUES (new.id, new.content, new.reasoning);
END;
CREATE VIRTUAL TABLE titles_fts USING fts5(title, content='conversations', content_rowid='num');
CREATE TRIGGER titles_fts_insert AFTER INSERT ON conversations BEGIN
    INSERT INTO titles_fts(rowid, title) VALUES (new.num, new.title);
END;
CREATE TRIGGER titles_fts_delete AFTER DELETE ON conversations BEGIN
    INSERT INTO titles_fts(titles_fts, rowid, title) VALUES ('delete', old.num, old.title);
END;
CREATE TRIGGER titles_fts_update AFTER UPDATE OF title ON conversations BEGIN
    INSERT INTO titles_fts(titles_fts, rowid, title) VALUES ('delete', old.num, old.title);
    INSERT INTO titles_fts(rowid, title) VALUES (new.num, new.title);
END;
INSERT INTO messages_fts(messages_fts) VALUES ('rebuild');
INSERT INTO titles_fts(titles_fts) VALUES ('rebuild');
"""


def history_path() -> Path:
    return home() / "history.sqlite3"


def attachment_store(history: Path | None = None) -> AttachmentStore:
    """Where the attachments of the history at ``history`` (default: the app's) are kept."""
    return AttachmentStore((history or history_path()).parent / "attachments")


def _fts5_available(db: sqlite3.Connection) -> bool:
    try:
        db.execute("CREATE VIRTUAL TABLE temp.fts5_probe USING fts5(x)")
        db.execute("DROP TABLE temp.fts5_probe")
        return True
    except sqlite3.OperationalError:
        return False


def _fts_query(text: str) -> str:
    """Every word of ``text`` as a quoted prefix term: user input never reaches FTS5's syntax."""
    return " ".join(f'"{word}"*' for word in re.findall(r"\w+", text))


def _decoded(value: bytes) -> str:
    """Text SQLite holds that is not UTF-8 (a damaged page, a hand-edit's cast), read with U+FFFD."""
    return value.decode(errors="replace")


def _text(value: Any) -> str:
    """A text column's value as text: a blob read as UTF-8, NULL as ""."""
    if isinstance(value, bytes):
        return _decoded(value)
    return "" if value is None else str(value)


def _time(value: Any) -> float:
    """A time column's value in seconds since the epoch; 0 when it is no number."""
    return finite(value) or 0.0


def _object(value: Any, what: str, message_id: int) -> dict[str, Any] | None:
    """A JSON column's object; None for NULL, and (logged) for anything else that is no JSON object."""
    if value is None:
        return None
    try:
        data = json.loads(_text(value))
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        log.warning("Ignored the %s of message %s in the chat history: not a JSON object.", what, message_id)
        return None
    return data


def _telemetry(value: Any, message_id: int) -> dict[str, Any] | None:
    """A reply's figures: only those that are finite numbers, as the app writes them."""
    data = _object(value, "figures", message_id)
    return None if data is None else {k: v for k, v in data.items() if finite(v) is not None}


def _run_card(value: Any, message_id: int) -> dict[str, Any] | None:
    data = _object(value, "run card", message_id)
    if data is not None:
        try:
            RunCard.from_json(data)
        except ValueError as err:
            log.warning("Ignored the run card of message %s in the chat history: %s.", message_id, err)
            return None
    return data


def _tool_calls(value: Any, message_id: int) -> tuple[dict[str, Any], ...]:
    data = _object(value, "tool calls", message_id)
    calls = data.get("calls") if data is not None else []
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        log.warning("Ignored the tool calls of message %s in the chat history: not a list.", message_id)
        return ()
    return tuple(calls)


def _summary(row: sqlite3.Row) -> ConversationSummary:
    return ConversationSummary(
        row["id"], _text(row["title"]), _time(row["created_at"]), _time(row["updated_at"])
    )


def _message(m: sqlite3.Row) -> StoredMessage | None:
    role = _text(m["role"])
    if role not in ROLES:
        log.warning(
            "Left out message %s of the chat history: its role %.40r is not one of %s.", m["id"], role, ROLES
        )
        return None
    try:
        state = MessageState(_text(m["state"]))
    except ValueError:
        log.warning(
            "Read message %s of the chat history as complete: its state %.40r is unknown.",
            m["id"],
            m["state"],
        )
        state = MessageState.COMPLETE
    return StoredMessage(
        m["id"],
        role,
        _text(m["content"]),
        _text(m["reasoning"]),
        state,
        _telemetry(m["telemetry"], m["id"]),
        _text(m["error"]),
        _time(m["created_at"]),
        _run_card(m["run_card"], m["id"]),
        _tool_calls(m["tool_calls"], m["id"]),
        left_out=m["left_out"] == 1,
    )


def _writes(method: Callable[Concatenate[History, P], R]) -> Callable[Concatenate[History, P], R]:
    """A write that SQLite refuses (disk full, read-only, I/O error) is a StorageError saying what to
    do; the database itself stays as it was (the transaction is rolled back)."""

    def write(self: History, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.OperationalError as err:
            raise StorageError(
                f"Could not save the chat history ({err}).",
                f"Free some disk space where it lives ({self.path.parent}), or check that it is writable; "
                "the conversation stays in the window meanwhile.",
            ) from None

    write.__doc__ = method.__doc__
    return write


class History:
    """The conversation store. Not thread-safe: use it from one thread (the UI's)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or history_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.attachments = attachment_store(self.path)
        self.warning = ""  # what went wrong opening the file, for the user
        try:
            self._db = self._open()
        except sqlite3.DatabaseError as err:
            backup = set_aside(self.path)
            for suffix in ("-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            self.warning = (
                f"The chat history file was unreadable ({err}); "
                f"kept it as {backup.name} and started a new one."
            )
            log.warning("%s", self.warning)
            self._db = self._open()

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None)
        try:
            db.row_factory = sqlite3.Row
            db.text_factory = _decoded
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # with WAL: durable across an app crash
            db.execute("PRAGMA foreign_keys=ON")
            db.execute("PRAGMA busy_timeout=5000")
            (check,) = db.execute("PRAGMA quick_check(1)").fetchone()
            if check != "ok":  # else the first read of a damaged page would raise, wherever it is
                raise sqlite3.DatabaseError(f"it is damaged: {check}")
            self._migrate(db)
            self.fts = _fts5_available(db)
            has_fts = db.execute("SELECT 1 FROM sqlite_master WHERE name = 'messages_fts'").fetchone()
            if self.fts and not has_fts:
                db.executescript(f"BEGIN; {_FTS_SCHEMA} COMMIT;")
        except BaseException:
            db.close()
            raise
        return db

    @staticmethod
    def _migrate(db: sqlite3.Connection) -> None:
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"schema version {version} is newer than this app's {SCHEMA_VERSION}")
        for step in range(version, SCHEMA_VERSION):
            try:
                db.executescript(f"BEGIN; {MIGRATIONS[step]}; PRAGMA user_version = {step + 1}; COMMIT;")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            with contextlib.suppress(sqlite3.Error):  # SQLite may have rolled back already (disk full)
                self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # Conversations

    @_writes
    def create_conversation(
        self, conversation_id: str, title: str = DEFAULT_TITLE, system_prompt: str = "", model: str = ""
    ) -> ConversationSummary:
        now = time.time()
        self._db.execute(
            "INSERT INTO conversations (id, title, system_prompt, model, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (conversation_id, title, system_prompt, model, now, now),
        )
        return ConversationSummary(conversation_id, title, now, now)

    def exists(self, conversation_id: str) -> bool:
        row = self._db.execute("SELECT 1 FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return row is not None

    def list_conversations(self) -> list[ConversationSummary]:
        """Every conversation, the most recently changed first."""
        rows = self._db.execute(
            "SELECT id, title, created_at, updated_at FROM conversations ORDER BY updated_at DESC, num DESC"
        )
        return [_summary(r) for r in rows]

    def conversation(self, conversation_id: str) -> Conversation | None:
        row = self._db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        if row is None:
            return None
        rows = self._db.execute(
            "SELECT * FROM messages WHERE conversation_id = ? ORDER BY position", (conversation_id,)
        )
        messages = [message for m in rows if (message := _message(m)) is not None]
        refs = self._refs(conversation_id)
        messages = [dataclasses.replace(m, attachments=refs[m.id]) if m.id in refs else m for m in messages]
        return Conversation(
            row["id"],
            _text(row["title"]),
            _text(row["system_prompt"]),
            _text(row["model"]),
            _time(row["created_at"]),
            _time(row["updated_at"]),
            messages,
        )

    @_writes
    def rename(self, conversation_id: str, title: str) -> None:
        self._db.execute(
            "UPDATE conversations SET title = ?, updated_at = ? WHERE id = ?",
            (title, time.time(), conversation_id),
        )

    @_writes
    def set_system_prompt(self, conversation_id: str, system_prompt: str) -> None:
        self._db.execute(
            "UPDATE conversations SET system_prompt = ? WHERE id = ?", (system_prompt, conversation_id)
        )

    @_writes
    def delete(self, conversation_id: str) -> None:
        """Delete the conversation, and the attachments no other chat refers to."""
        with self._transaction() as db:
            hashes = self._hashes(db, "m.conversation_id = ?", (conversation_id,))
            db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
        self._drop_unused(hashes)

    def search(self, query: str) -> list[ConversationSummary]:
        """Conversations whose title or any message holds every word of ``query`` (as a prefix)."""
        words = re.findall(r"\w+", query)
        if not words:
            return self.list_conversations()
        if self.fts:
            match = _fts_query(query)
            sql = """
                SELECT id, title, created_at, updated_at FROM conversations WHERE
                  num IN (SELECT rowid FROM titles_fts WHERE titles_fts MATCH ?)
                  OR id IN (SELECT m.conversation_id FROM messages m
                            JOIN messages_fts f ON f.rowid = m.id WHERE messages_fts MATCH ?)
                ORDER BY updated_at DESC, num DESC
            """
            rows = self._db.execute(sql, (match, match))
        else:
            clauses, params = [], []
            for word in words:
                like = f"%{word}%"
                clauses.append(
                    "(title LIKE ? OR id IN (SELECT conversation_id FROM messages"
                    " WHERE content LIKE ? OR reasoning LIKE ?))"
                )
                params += [like, like, like]
            rows = self._db.execute(
                "SELECT id, title, created_at, updated_at FROM conversations WHERE "
                + " AND ".join(clauses)
                + " ORDER BY updated_at DESC, num DESC",
                params,
            )
        return [_summary(r) for r in rows]

    # Messages

    @_writes
    def append_message(
        self,
        conversation_id: str,
        role: str,
        content: str = "",
        reasoning: str = "",
        state: MessageState = MessageState.COMPLETE,
    ) -> int:
        """Add a message at the end of the conversation; returns its id."""
        now = time.time()
        with self._transaction() as db:
            return self._insert(db, conversation_id, role, content, reasoning, state, now)

    @staticmethod
    def _insert(
        db: sqlite3.Connection,
        conversation_id: str,
        role: str,
        content: str,
        reasoning: str,
        state: MessageState,
        now: float,
    ) -> int:
        (position,) = db.execute(
            "SELECT COALESCE(MAX(position) + 1, 0) FROM messages WHERE conversation_id = ?",
            (conversation_id,),
        ).fetchone()
        cursor = db.execute(
            "INSERT INTO messages (conversation_id, position, role, content, reasoning, state, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (conversation_id, position, role, content, reasoning, state.value, now),
        )
        db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, conversation_id))
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    @_writes
    def update_message(
        self,
        message_id: int,
        content: str,
        reasoning: str = "",
        state: MessageState | None = None,
        telemetry: dict[str, Any] | None = None,
        error: str | None = None,
        run_card: dict[str, Any] | None = None,
        tool_calls: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        """Replace a message's text (a streaming reply as it grows); optionally its state, telemetry, run
        card and tool calls."""
        sets, params = ["content = ?", "reasoning = ?"], [content, reasoning]
        if state is not None:
            sets.append("state = ?")
            params.append(state.value)
        if telemetry is not None:
            sets.append("telemetry = ?")
            params.append(json.dumps(telemetry, sort_keys=True))
        if error is not None:
            sets.append("error = ?")
            params.append(error)
        if run_card is not None:
            sets.append("run_card = ?")
            params.append(json.dumps(run_card, sort_keys=True))
        if tool_calls is not None:
            sets.append("tool_calls = ?")
            params.append(json.dumps({"calls": list(tool_calls)}, sort_keys=True))
        self._db.execute(f"UPDATE messages SET {', '.join(sets)} WHERE id = ?", (*params, message_id))

    @_writes
    def sync_messages(
        self,
        conversation_id: str,
        messages: Sequence[tuple[str, str]],
        attachments: Sequence[Sequence[AttachmentRef]] = (),
    ) -> None:
        """Make the conversation's messages ``messages`` (role, content), the first ones carrying
        ``attachments`` (one sequence per message, in order, kept in ``self.attachments`` already): keep
        the common prefix, replace the rest. Regenerate and edit-and-resend drop what followed the changed
        message this way; an attachment no message refers to any more is deleted."""
        now = time.time()
        wanted = [tuple(refs) for refs in attachments] + [()] * max(0, len(messages) - len(attachments))
        with self._transaction() as db:
            stored = db.execute(
                "SELECT id, position, role, content FROM messages WHERE conversation_id = ?"
                " ORDER BY position",
                (conversation_id,),
            ).fetchall()
            refs = self._refs(conversation_id)
            keep = 0
            for row, (role, content), carried in zip(stored, messages, wanted, strict=False):
                if (row["role"], row["content"], refs.get(row["id"], ())) != (role, content, carried):
                    break
                keep += 1
            dropped = self._hashes(db, "m.conversation_id = ? AND m.position >= ?", (conversation_id, keep))
            db.execute(
                "DELETE FROM messages WHERE conversation_id = ? AND position >= ?", (conversation_id, keep)
            )
            for (role, content), carried in zip(messages[keep:], wanted[keep:], strict=True):
                message_id = self._insert(db, conversation_id, role, content, "", MessageState.COMPLETE, now)
                db.executemany(
                    "INSERT INTO message_attachments (message_id, position, sha256, ref) VALUES (?, ?, ?, ?)",
                    [(message_id, i, r.sha256, json.dumps(r.to_json())) for i, r in enumerate(carried)],
                )
        self._drop_unused(dropped)

    # Attachments

    def _refs(self, conversation_id: str) -> dict[int, tuple[AttachmentRef, ...]]:
        """The attachments of the conversation's messages, by message id; a reference that cannot be
        read (a hand-edit, a damaged page) is left out, in the log."""
        rows = self._db.execute(
            "SELECT a.message_id, a.ref FROM message_attachments a JOIN messages m ON m.id = a.message_id"
            " WHERE m.conversation_id = ? ORDER BY a.message_id, a.position",
            (conversation_id,),
        )
        found: dict[int, list[AttachmentRef]] = {}
        for row in rows:
            try:
                ref = AttachmentRef.from_json(json.loads(_text(row["ref"])))
            except (ValueError, RecursionError, AttributeError) as err:
                log.warning("Left out an attachment of message %s in the chat history: %s.", row[0], err)
                continue
            found.setdefault(row["message_id"], []).append(ref)
        return {message_id: tuple(refs) for message_id, refs in found.items()}

    def attachments_of(self, conversation_id: str) -> list[AttachmentRef]:
        """Every attachment of the conversation, once each, in the order they were attached."""
        seen: dict[str, AttachmentRef] = {}
        for refs in self._refs(conversation_id).values():
            for ref in refs:
                seen.setdefault(ref.sha256, ref)
        return list(seen.values())

    @staticmethod
    def _hashes(db: sqlite3.Connection, where: str, params: tuple[Any, ...]) -> set[str]:
        rows = db.execute(
            "SELECT DISTINCT a.sha256 FROM message_attachments a JOIN messages m ON m.id = a.message_id"
            f" WHERE {where}",
            params,
        )
        return {_text(row[0]) for row in rows}

    def release_attachments(self, hashes: Sequence[str], others: Sequence[str] = ()) -> None:
        """The message ``hashes`` were held for (``AttachmentStore.hold``) is saved, or did not go: they
        are held no more, and the files of these and of ``others`` that no message refers to (and none
        holds) are deleted."""
        self.attachments.release(hashes)
        self._drop_unused({*hashes, *others})

    def collect_unused(self) -> None:
        """Delete every kept file that no message refers to and none is held for: those of messages that
        never went (the app ended before they were saved)."""
        try:
            kept = self.attachments.kept()
        except OSError as err:
            log.warning("Could not list the attachments in %s: %s", self.attachments.root, err)
            return
        self._drop_unused(kept)

    def _drop_unused(self, hashes: set[str]) -> None:
        """Delete the kept files of ``hashes`` that no message refers to any more, and none is held for."""
        for sha in hashes:
            if self.attachments.held(sha):
                continue
            if self._db.execute("SELECT 1 FROM message_attachments WHERE sha256 = ?", (sha,)).fetchone():
                continue
            try:
                self.attachments.remove(sha)
            except (OSError, LemonDeskError) as err:  # kept: a file left over is no harm
                log.warning("Could not delete the unused attachment %s: %s", sha, err)

    @_writes
    def set_left_out(self, conversation_id: str, count: int) -> None:
        """Mark the conversation's ``count`` oldest messages as left out of what is sent to the model,
        and the others as sent: nothing is deleted."""
        with self._transaction() as db:
            db.execute(
                "UPDATE messages SET left_out = position IN (SELECT position FROM messages"
                " WHERE conversation_id = ? ORDER BY position LIMIT ?) WHERE conversation_id = ?",
                (conversation_id, count, conversation_id),
            )

    def recent_telemetry(self, since: float) -> list[tuple[float, dict[str, Any]]]:
        """(when, telemetry) of every reply with figures since ``since`` (seconds since the epoch), oldest
        first: the Telemetry view's per-request history."""
        rows = self._db.execute(
            "SELECT id, created_at, telemetry FROM messages WHERE telemetry IS NOT NULL AND created_at >= ?"
            " ORDER BY created_at",
            (since,),
        )
        found = [(finite(r["created_at"]), _telemetry(r["telemetry"], r["id"])) for r in rows]
        return [(when, figures) for when, figures in found if when is not None and figures is not None]

    # Export

    def export_markdown(self, conversation_id: str, path: Path) -> None:
        conversation = self._require(conversation_id)
        files = self._export_attachments(conversation, path)
        atomic_write_bytes(path, to_markdown(conversation, files).encode())

    def export_json(self, conversation_id: str, path: Path) -> None:
        conversation = self._require(conversation_id)
        files = self._export_attachments(conversation, path)
        data = json.dumps(to_json(conversation, files), indent=2, ensure_ascii=False) + "\n"
        atomic_write_bytes(path, data.encode())

    def _export_attachments(self, conversation: Conversation, path: Path) -> dict[str, str]:
        """Copy the conversation's attachments into ``<export name>-attachments/`` beside the export;
        returns each copied one's file, relative to the export, by hash (one unreadable is left out)."""
        folder = path.with_name(f"{path.stem}-attachments")
        files: dict[str, str] = {}
        for ref in {r.sha256: r for m in conversation.messages for r in m.attachments}.values():
            data = self.attachments.read(ref.sha256)
            if isinstance(data, bytes):
                atomic_write_bytes(folder / export_name(ref), data)
                files[ref.sha256] = f"{folder.name}/{export_name(ref)}"
        return files

    def _require(self, conversation_id: str) -> Conversation:
        conversation = self.conversation(conversation_id)
        if conversation is None:
            raise LookupError(f"no conversation {conversation_id}")
        return conversation


_ROLE_HEADINGS = {"user": "You", "assistant": "Assistant", "system": "System"}


def _attachment_lines(message: StoredMessage, files: Mapping[str, str]) -> str:
    lines = []
    for ref in message.attachments:
        file = files.get(ref.sha256)
        if file is None:
            lines.append(f"- Attached: {ref.name} (its file is missing or damaged in the app's folder)")
        elif ref.kind is AttachmentKind.IMAGE:
            lines.append(f"- Attached: ![{ref.name}](<{file}>)")
        else:
            part = " (only the part that fit the context was sent)" if ref.sent_chars is not None else ""
            lines.append(f"- Attached: [{ref.name}](<{file}>){part}")
    return "\n".join(lines) + "\n"


def to_markdown(conversation: Conversation, files: Mapping[str, str] | None = None) -> str:
    """``files``: the exported attachments' files by hash (``History._export_attachments``)."""
    parts = [f"# {conversation.title}\n"]
    if conversation.model:
        parts.append(f"Model: `{conversation.model}`\n")
    if conversation.system_prompt:
        parts.append(f"## System\n\n{conversation.system_prompt}\n")
    for message in conversation.messages:
        parts.append(f"## {_ROLE_HEADINGS.get(message.role, message.role)}\n")
        if message.left_out:
            parts.append(f"*({LEFT_OUT_NOTE})*\n")
        if message.reasoning:
            quoted = "\n".join(f"> {line}" if line else ">" for line in message.reasoning.splitlines())
            parts.append(f"> **Reasoning**\n>\n{quoted}\n")
        parts.extend(_tool_call_markdown(call) for call in message.tool_calls)
        parts.append(f"{message.content}\n")
        if message.attachments:
            parts.append(_attachment_lines(message, files or {}))
        if message.state is not MessageState.COMPLETE:
            parts.append(f"*({message.state.value}{': ' + message.error if message.error else ''})*\n")
        if message.run_card:
            parts.append(f"> **Run card**\n>\n{RunCard.from_json(message.run_card).markdown()}")
    return "\n".join(parts)


def _tool_call_markdown(call: dict[str, Any]) -> str:
    arguments = json.dumps(call.get("arguments", {}), ensure_ascii=False)
    result = "\n".join(f"> {line}" if line else ">" for line in str(call.get("result", "")).splitlines())
    head = f"> **Tool** `{call.get('server', '')}` / `{call.get('tool', '')}` ({call.get('outcome', '')})"
    return f"{head}\n>\n> `{arguments}`\n>\n{result}\n"


def _attachments_json(message: StoredMessage, files: Mapping[str, str]) -> list[dict[str, Any]]:
    return [{**ref.to_json(), "file": files.get(ref.sha256)} for ref in message.attachments]


def to_json(conversation: Conversation, files: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``files``: the exported attachments' files by hash; an attachment without one has ``file: null``."""
    return {
        "id": conversation.id,
        "title": conversation.title,
        "model": conversation.model,
        "system_prompt": conversation.system_prompt,
        "created_at": conversation.created_at,
        "updated_at": conversation.updated_at,
        "messages": [
            {
                "role": m.role,
                "content": m.content,
                "reasoning": m.reasoning,
                "state": m.state.value,
                "telemetry": m.telemetry,
                "error": m.error,
                "created_at": m.created_at,
                "run_card": m.run_card,
                "tool_calls": list(m.tool_calls),
                **({"attachments": _attachments_json(m, files or {})} if m.attachments else {}),
                "left_out": m.left_out,
            }
            for m in conversation.messages
        ],
    }
