"""The chat history store: real SQLite files under the test's LEMON_DESK_HOME."""

from __future__ import annotations

import json
import logging
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app.core.chat import MessageState
from app.core.runcard import RunCard
from app.store.history import (
    _RUN_CARD_V2,
    _SCHEMA_V1,
    DEFAULT_TITLE,
    SCHEMA_VERSION,
    History,
    history_path,
    to_json,
    to_markdown,
)


@pytest.fixture
def history() -> History:
    store = History()
    yield store
    store.close()


def test_database_lives_under_home_in_wal_mode_with_a_schema_version(lemon_home: Path) -> None:
    store = History()
    store.close()
    assert history_path() == lemon_home / "history.sqlite3"
    db = sqlite3.connect(history_path())
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.close()


def test_create_list_newest_first_rename_delete(history: History) -> None:
    history.create_conversation("a", "First")
    history.create_conversation("b", "Second")
    history.append_message("a", "user", "bump a")  # a is now the most recently changed
    assert [c.id for c in history.list_conversations()] == ["a", "b"]
    history.rename("b", "Renamed")
    listed = {c.id: c.title for c in history.list_conversations()}
    assert listed == {"a": "First", "b": "Renamed"}
    assert history.list_conversations()[0].id == "b"
    history.delete("a")
    assert [c.id for c in history.list_conversations()] == ["b"]
    assert history.conversation("a") is None
    # Deleting a conversation deletes its messages.
    assert history._db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0


def test_messages_stream_telemetry_and_states(history: History) -> None:
    history.create_conversation("c", system_prompt="Be brief.", model="smollm2")
    history.append_message("c", "user", "Hello")
    reply = history.append_message("c", "assistant", state=MessageState.STREAMING)
    history.update_message(reply, "Hi", "thinking")
    history.update_message(reply, "Hi there", "thinking more", MessageState.COMPLETE, {"ttft_s": 0.12})
    conv = history.conversation("c")
    assert conv is not None
    assert conv.system_prompt == "Be brief." and conv.model == "smollm2" and conv.title == DEFAULT_TITLE
    assert [(m.role, m.content, m.reasoning, m.state) for m in conv.messages] == [
        ("user", "Hello", "", MessageState.COMPLETE),
        ("assistant", "Hi there", "thinking more", MessageState.COMPLETE),
    ]
    assert conv.messages[1].telemetry == {"ttft_s": 0.12}


def test_sync_messages_keeps_the_common_prefix_and_replaces_the_rest(history: History) -> None:
    history.create_conversation("c")
    for role, text in [("user", "one"), ("assistant", "1"), ("user", "two"), ("assistant", "2")]:
        history.append_message("c", role, text)
    first_ids = [m.id for m in history.conversation("c").messages]  # type: ignore[union-attr]
    # Regenerate: the last reply goes.
    history.sync_messages("c", [("user", "one"), ("assistant", "1"), ("user", "two")])
    conv = history.conversation("c")
    assert conv is not None
    assert [m.content for m in conv.messages] == ["one", "1", "two"]
    assert [m.id for m in conv.messages] == first_ids[:3]
    # Edit-and-resend of the first message: everything after it goes.
    history.sync_messages("c", [("user", "ONE")])
    conv = history.conversation("c")
    assert conv is not None
    assert [(m.role, m.content) for m in conv.messages] == [("user", "ONE")]


@pytest.mark.parametrize("fts", [True, False], ids=["fts5", "like"])
def test_search_titles_and_messages(history: History, fts: bool) -> None:
    history.fts = fts and history.fts
    history.create_conversation("a", "Rust lifetimes")
    history.create_conversation("b", "Cooking")
    history.append_message("b", "user", "How long to boil an egg?")
    history.append_message("b", "assistant", "About nine minutes for a hard-boiled egg.")
    history.create_conversation("c", "Other")
    reply = history.append_message("c", "assistant", "", state=MessageState.STREAMING)
    history.update_message(reply, "quantum entanglement explained")
    assert [c.id for c in history.search("lifetimes")] == ["a"]
    assert [c.id for c in history.search("boil egg")] == ["b"]
    assert [c.id for c in history.search("hard-boil")] == ["b"]  # prefixes; punctuation is no syntax
    assert [c.id for c in history.search("quantum")] == ["c"]  # the streamed update was indexed
    assert history.search("boil rust") == []  # every word must match
    assert [c.id for c in history.search('"')] == [c.id for c in history.list_conversations()]
    history.rename("c", "Physics chat")
    assert [c.id for c in history.search("physics")] == ["c"]
    history.delete("b")
    assert history.search("egg") == []


def test_export_markdown_and_json(history: History, tmp_path: Path) -> None:
    history.create_conversation("c", "Greetings", system_prompt="Be kind.", model="m")
    history.append_message("c", "user", "Hi")
    reply = history.append_message("c", "assistant", state=MessageState.STREAMING)
    history.update_message(reply, "```py\nprint(1)\n```", "why\nnot", MessageState.STOPPED, {"decode_tps": 9})
    history.export_markdown("c", tmp_path / "out.md")
    history.export_json("c", tmp_path / "out.json")
    markdown = (tmp_path / "out.md").read_text()
    assert markdown == (
        "# Greetings\n\nModel: `m`\n\n## System\n\nBe kind.\n\n## You\n\nHi\n\n## Assistant\n\n"
        "> **Reasoning**\n>\n> why\n> not\n\n```py\nprint(1)\n```\n\n*(stopped)*\n"
    )
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["title"] == "Greetings" and data["system_prompt"] == "Be kind."
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"]
    assert data["messages"][1]["telemetry"] == {"decode_tps": 9}
    assert data["messages"][1]["state"] == "stopped"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out")) == ["out.json", "out.md"]


def test_a_corrupt_file_is_set_aside_and_a_new_history_starts(
    lemon_home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lemon_home.mkdir(parents=True, exist_ok=True)
    history_path().write_bytes(b"this is not a database" * 100)
    store = History()
    try:
        assert "unreadable" in store.warning and caplog.messages == [store.warning]
        assert store.list_conversations() == []
        store.create_conversation("x")
        assert [c.id for c in store.list_conversations()] == ["x"]
    finally:
        store.close()
    kept = list(lemon_home.glob("history.sqlite3.corrupt-*"))
    assert len(kept) == 1 and kept[0].read_bytes().startswith(b"this is not a database")


def test_a_crash_mid_stream_keeps_the_partial_reply_and_everything_before(lemon_home: Path) -> None:
    """A real child process writes a streaming reply and is killed with SIGKILL mid-stream."""
    child = textwrap.dedent(
        """
        import itertools, sys
        from app.store.history import History, MessageState
        store = History()
        store.create_conversation("c", "Crash test")
        store.append_message("c", "user", "Tell me a long story")
        reply = store.append_message("c", "assistant", state=MessageState.STREAMING)
        text = ""
        for n in itertools.count():
            text += f"word{n} "
            store.update_message(reply, text, "planning")
            print(n, flush=True)
        """
    )
    with subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        last = -1
        while last < 50:
            last = int(proc.stdout.readline())
        proc.kill()
    store = History()
    try:
        conv = store.conversation("c")
        assert conv is not None and conv.title == "Crash test"
        user, reply = conv.messages
        assert (user.role, user.content) == ("user", "Tell me a long story")
        assert reply.state is MessageState.STREAMING  # shown as interrupted
        assert reply.reasoning == "planning"
        words = reply.content.split()
        assert len(words) > last  # every update the child reported is there
        assert words == [f"word{n}" for n in range(len(words))]
    finally:
        store.close()


def test_a_newer_schema_is_refused_not_overwritten(lemon_home: Path) -> None:
    History().close()
    db = sqlite3.connect(history_path())
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    store = History()
    try:
        assert "newer" in store.warning
    finally:
        store.close()
    assert list(lemon_home.glob("history.sqlite3.corrupt-*"))


def test_a_version_1_database_gains_run_cards(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(_SCHEMA_V1 + "PRAGMA user_version = 1;")
    db.execute("INSERT INTO conversations (id, title, created_at, updated_at) VALUES ('c', 'Old', 1, 1)")
    db.execute(
        "INSERT INTO messages (conversation_id, position, role, content, state, created_at)"
        " VALUES ('c', 0, 'assistant', 'kept', 'complete', 1)"
    )
    db.commit()
    db.close()
    history = History(path)
    try:
        (old,) = history.conversation("c").messages  # type: ignore[union-attr]
        assert (old.content, old.run_card) == ("kept", None)
        card = RunCard("m", "org/m-GGUF:Q4_0", "Q4_0", "llamacpp", "cpu", "b1", None, "").to_json()
        history.update_message(old.id, "kept", run_card=card)
        (new,) = history.conversation("c").messages  # type: ignore[union-attr]
        assert new.run_card == card
        assert history._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        history.close()


def test_rows_a_hand_edit_damaged_are_read_for_what_they_hold(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SQLite keeps whatever is put in a column, and a table made again by hand may allow NULL: text is
    read as text, a time that is no number as 0, figures and run cards that cannot be read as none, and a
    message of an unknown role is left out (it would go to the engine with the next question)."""
    path = tmp_path / "hand.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(f"{_SCHEMA_V1.replace(' NOT NULL', '')}; {_RUN_CARD_V2}; PRAGMA user_version = 2;")
    db.execute(  # a blob for the title, text that is not UTF-8 for the model
        "INSERT INTO conversations (id, title, model, created_at, updated_at)"
        " VALUES ('c', X'4869ff', CAST(X'6dff' AS TEXT), 'then', NULL)"
    )
    figures = '{"ttft_s": 0.5, "decode_tps": "fast", "prompt_tps": 1e999}'
    deep = "[" * 100_000 + "]" * 100_000
    rows = [  # role, content, state, telemetry, created_at, run_card
        ("user", None, "complete", None, 1.0, None),
        ("assistant", b"blob \xff", "bogus", "{bad", "yesterday", "[1]"),
        ("wizard", "from a hand-edit", "complete", None, 3.0, None),
        ("assistant", "kept", "stopped", figures, 4.0, "{}"),
        ("assistant", "deep", "complete", b"\x00\xff", 5.0, deep),
    ]
    for position, row in enumerate(rows):
        db.execute(
            "INSERT INTO messages (conversation_id, position, role, content, state, telemetry, created_at,"
            " run_card) VALUES ('c', ?, ?, ?, ?, ?, ?, ?)",
            (position, *row),
        )
    db.commit()
    db.close()
    store = History(path)
    try:
        with caplog.at_level(logging.WARNING, "app.store.history"):
            (summary,) = store.list_conversations()
            assert [c.id for c in store.search("blob")] == ["c"]
            conversation = store.conversation("c")
            recent = store.recent_telemetry(0)
    finally:
        store.close()
    assert (summary.title, summary.created_at, summary.updated_at) == ("Hi\ufffd", 0, 0)
    assert conversation is not None and conversation.model == "m\ufffd"
    read = [
        (m.role, m.content, m.state, m.telemetry, m.created_at, m.run_card) for m in conversation.messages
    ]
    assert read == [
        ("user", "", MessageState.COMPLETE, None, 1.0, None),
        ("assistant", "blob \ufffd", MessageState.COMPLETE, None, 0.0, None),
        ("assistant", "kept", MessageState.STOPPED, {"ttft_s": 0.5}, 4.0, None),
        ("assistant", "deep", MessageState.COMPLETE, None, 5.0, None),
    ]
    assert recent == [(4.0, {"ttft_s": 0.5})]  # the Telemetry view's; "yesterday" is no time
    assert "from a hand-edit" not in to_markdown(conversation) and json.dumps(to_json(conversation))
    said = "\n".join(caplog.messages)
    assert "role 'wizard'" in said and "state 'bogus'" in said and said.count("Ignored the run card") == 3


def test_a_database_with_damaged_pages_is_set_aside(lemon_home: Path) -> None:
    """Its header is fine, so it opened; the first read of a damaged page then raised DatabaseError
    ('database disk image is malformed'), in the window's first listing of the conversations."""
    store = History()
    for n in range(50):
        store.create_conversation(f"c{n}", f"Chat {n}")
        store.append_message(f"c{n}", "user", "hello " * 100)
    store.close()
    data = bytearray(history_path().read_bytes())
    page = 4096
    data[3 * page : 4 * page] = b"\xa5" * page
    history_path().write_bytes(bytes(data))
    store = History()
    try:
        assert "unreadable (it is damaged" in store.warning and store.list_conversations() == []
    finally:
        store.close()
    assert [p.read_bytes() for p in lemon_home.glob("history.sqlite3.corrupt-*")] == [bytes(data)]


CALL = {
    "call_id": "call_1",
    "server": "files",
    "tool": "read_file",
    "arguments": {"path": "/tmp/notes.txt"},
    "outcome": "ok",
    "result": "line one\nline two",
    "elapsed_s": 0.25,
}


def test_a_version_2_database_gains_tool_calls_kept_and_exported(tmp_path: Path) -> None:
    path = tmp_path / "v2.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(f"{_SCHEMA_V1}; {_RUN_CARD_V2}; PRAGMA user_version = 2;")
    db.execute("INSERT INTO conversations (id, title, created_at, updated_at) VALUES ('c', 'Old', 1, 1)")
    db.execute(
        "INSERT INTO messages (conversation_id, position, role, content, state, created_at)"
        " VALUES ('c', 0, 'assistant', 'kept', 'complete', 1)"
    )
    db.commit()
    db.close()
    history = History(path)
    try:
        (old,) = history.conversation("c").messages  # type: ignore[union-attr]
        assert old.tool_calls == ()
        history.update_message(old.id, "It says two lines.", tool_calls=[CALL])
        conversation = history.conversation("c")
        assert conversation is not None
        assert conversation.messages[0].tool_calls == (CALL,)
        assert history._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        history.close()
    assert to_json(conversation)["messages"][0]["tool_calls"] == [CALL]
    markdown = to_markdown(conversation)
    assert (
        '> **Tool** `files` / `read_file` (ok)\n>\n> `{"path": "/tmp/notes.txt"}`\n>\n> line one\n> line two'
        in markdown
    )
    assert markdown.index("read_file") < markdown.index("It says two lines.")


@pytest.mark.parametrize("stored", ["[1, 2]", '{"calls": 5}', '{"calls": [1]}', "not json"])
def test_tool_calls_a_hand_edit_damaged_are_read_as_none(
    history: History, stored: str, caplog: pytest.LogCaptureFixture
) -> None:
    history.create_conversation("c")
    message = history.append_message("c", "assistant", "reply")
    history._db.execute("UPDATE messages SET tool_calls = ? WHERE id = ?", (stored, message))
    with caplog.at_level(logging.WARNING):
        (read,) = history.conversation("c").messages  # type: ignore[union-attr]
    assert (read.content, read.tool_calls) == ("reply", ())
    assert "tool calls of message" in caplog.text


def test_a_version_2_database_gains_left_out_messages_which_are_marked_and_never_deleted(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v2.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(f"{_SCHEMA_V1}; {_RUN_CARD_V2}; PRAGMA user_version = 2;")
    db.execute("INSERT INTO conversations (id, title, created_at, updated_at) VALUES ('c', 'Old', 1, 1)")
    for position, (role, content) in enumerate([("user", "one"), ("assistant", "two"), ("user", "three")]):
        db.execute(
            "INSERT INTO messages (conversation_id, position, role, content, state, created_at)"
            " VALUES ('c', ?, ?, ?, 'complete', 1)",
            (position, role, content),
        )
    db.commit()
    db.close()
    history = History(path)
    try:
        assert [m.left_out for m in history.conversation("c").messages] == [False] * 3  # type: ignore[union-attr]
        history.set_left_out("c", 2)
        history.sync_messages(
            "c", [("user", "one"), ("assistant", "two"), ("user", "three"), ("assistant", "4")]
        )
        kept = history.conversation("c")
        assert kept is not None
        assert [(m.content, m.left_out) for m in kept.messages] == [
            ("one", True),
            ("two", True),
            ("three", False),
            ("4", False),
        ]
        assert "left out of the model's context" in to_markdown(kept).split("## ")[2]
        assert [m["left_out"] for m in to_json(kept)["messages"]] == [True, True, False, False]
    finally:
        history.close()
