"""Attachments: what a user attaches is read for real (text, PDF, images), kept once by hash next to a
real SQLite history, shared between chats, deleted with the last chat that uses it, exported with it."""

from __future__ import annotations

import asyncio
import itertools
import json
import sqlite3
from pathlib import Path

import pytest

from app.core.attachments import (
    AttachmentKind,
    AttachmentRef,
    TokenCount,
    Unreadable,
    fit_in_context,
    message_content,
)
from app.core.errors import AttachmentError
from app.store.attachments import MAX_IMAGE_SIDE, AttachmentStore, ingest, sha256_of
from app.store.history import _ATTACHMENTS_V4, _RUN_CARD_V2, _SCHEMA_V1, SCHEMA_VERSION, History
from app.store.model_options import ModelOptions
from app.store.settings import Settings
from app.supervisor.router import Router
from tests.support.documents import long_text, write_image, write_pdf
from tests.support.standin import make_standin_model


@pytest.fixture
def history(tmp_path: Path) -> History:
    store = History(tmp_path / "history.sqlite3")
    yield store
    store.close()


def _attach(history: History, path: Path) -> AttachmentRef:
    taken = ingest(path)
    history.attachments.put(taken.data)
    return taken.ref


# --- reading what the user attached -----------------------------------------------------------------


def test_a_200_page_text_is_taken_whole(tmp_path: Path) -> None:
    book = long_text(200)
    path = tmp_path / "book.txt"
    path.write_text(book)
    taken = ingest(path)
    assert taken.ref.kind is AttachmentKind.TEXT
    assert taken.text == book
    assert taken.ref.sha256 == sha256_of(book.encode())
    assert "Page  200 line 50" in taken.text


def test_a_pdf_is_taken_as_its_text_layer(tmp_path: Path) -> None:
    path = write_pdf(tmp_path / "report.pdf", ["Quarterly revenue rose", "Costs (mostly servers) fell"])
    taken = ingest(path)
    assert taken.ref.name == "report.pdf"
    assert taken.ref.mime.startswith("text/plain")
    assert "Quarterly revenue rose" in taken.text
    assert "Costs (mostly servers) fell" in taken.text


def test_a_pdf_that_is_not_one_is_refused_clearly(tmp_path: Path) -> None:
    path = tmp_path / "fake.pdf"
    path.write_bytes(b"%PDF-1.4\nthis is no pdf at all")
    with pytest.raises(AttachmentError, match=r"fake\.pdf was not attached: it is not a readable PDF"):
        ingest(path)


def test_a_binary_renamed_txt_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(bytes(range(256)) * 64)  # as an executable or a zip would start
    with pytest.raises(AttachmentError, match=r"notes\.txt was not attached: its content is binary"):
        ingest(path)
    png = tmp_path / "photo.txt"
    write_image(tmp_path / "photo.png", 32, 32).rename(png)
    with pytest.raises(AttachmentError, match="binary"):
        ingest(png)


def test_text_that_is_not_english_nor_ascii_is_text(tmp_path: Path) -> None:
    path = tmp_path / "poem.md"
    path.write_text("# Gedicht\n\nÜber allen Gipfeln ist Ruh — 静かな夜\n\ttabbed\x1b[0m\n" * 400)
    assert "静かな夜" in ingest(path).text


def test_a_file_gone_before_it_is_read_is_said(tmp_path: Path) -> None:
    with pytest.raises(AttachmentError, match=r"gone.txt was not attached: it is no longer at"):
        ingest(tmp_path / "gone.txt")


def test_a_type_the_chat_does_not_take_is_refused_with_what_it_takes(tmp_path: Path) -> None:
    path = tmp_path / "movie.mkv"
    path.write_bytes(b"\x1aE\xdf\xa3")
    with pytest.raises(AttachmentError, match="the chat takes text, Markdown, code, CSV, JSON, PDF"):
        ingest(path)


def test_a_large_image_is_scaled_down_to_what_the_projector_takes(tmp_path: Path) -> None:
    from PIL import Image

    taken = ingest(write_image(tmp_path / "big.png", 3000, 2000))
    assert taken.ref.kind is AttachmentKind.IMAGE
    with Image.open(__import__("io").BytesIO(taken.data)) as image:
        assert max(image.size) == MAX_IMAGE_SIDE
        assert image.size[0] / image.size[1] == pytest.approx(1.5, rel=0.01)
    small = write_image(tmp_path / "small.png", 64, 48)
    assert ingest(small).data == small.read_bytes()  # small enough: sent as it is


def test_an_image_that_is_not_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "broken.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 10)
    with pytest.raises(AttachmentError, match=r"broken\.png was not attached: it is not an image"):
        ingest(path)


# --- what the model is sent ---------------------------------------------------------------------------


def test_content_names_each_file_and_sends_images_as_data_urls(tmp_path: Path) -> None:
    doc = ingest(write_pdf(tmp_path / "a.pdf", ["alpha beta"]))
    image = ingest(write_image(tmp_path / "cat.png", 8, 8))
    content = message_content("What is this?", [(doc.ref, doc.data), (image.ref, image.data)])
    assert isinstance(content, list)
    text, picture = content
    assert text["type"] == "text"
    assert text["text"].startswith("What is this?\n\nAttached file a.pdf:\n```\nalpha beta")
    assert picture["type"] == "image_url"
    assert picture["image_url"]["url"].startswith("data:image/png;base64,iVBOR")
    assert message_content("plain", []) == "plain"


def test_the_part_that_fits_is_named_as_such() -> None:
    text = "x" * 1000
    ref = AttachmentRef("0" * 64, "big.log", AttachmentKind.TEXT, "text/plain", 1000)
    fit = fit_in_context(TokenCount(500, exact=True), len(text), 200)
    assert fit is not None and (fit.over, fit.fitting_chars) == (300, 380)  # 400, less the margin
    content = message_content("Summarise", [(ref.partial(fit.fitting_chars), text.encode())])
    assert isinstance(content, str)
    assert "only its first 380 of 1,000 characters: the part that fits the context" in content
    assert "x" * 381 not in content
    assert fit_in_context(TokenCount(100, exact=False), 400, 200) is None


def test_an_unreadable_attachment_is_said_to_the_model_too() -> None:
    ref = AttachmentRef("0" * 64, "gone.csv", AttachmentKind.TEXT, "text/plain", 3)
    content = message_content("and this?", [(ref, Unreadable.MISSING)])
    assert content == "and this?\n\n[gone.csv: the attachment's file is missing from the app's folder.]"


# --- the store and the history ---------------------------------------------------------------------------


def test_kept_once_by_hash_atomically(tmp_path: Path) -> None:
    store = AttachmentStore(tmp_path / "attachments")
    sha = store.put(b"hello")
    assert sha == sha256_of(b"hello")
    assert store.path(sha) == tmp_path / "attachments" / sha[:2] / sha
    assert store.put(b"hello") == sha
    assert store.kept() == {sha}
    assert not list(store.root.rglob("*.tmp"))
    assert store.read(sha) == b"hello"


def test_a_name_that_is_no_hash_never_becomes_a_path(tmp_path: Path) -> None:
    from app.core.errors import UnsafePathError

    store = AttachmentStore(tmp_path / "attachments")
    with pytest.raises(UnsafePathError):
        store.path("../../etc/passwd")


def test_one_file_shared_by_two_chats_is_deleted_with_the_last(history: History, tmp_path: Path) -> None:
    source = tmp_path / "notes.md"
    source.write_text("# Shared notes\n")
    ref = _attach(history, source)
    for chat in ("a", "b"):
        history.create_conversation(chat)
        history.sync_messages(chat, [("user", f"look ({chat})"), ("assistant", "ok")], [[ref]])
    assert history.attachments.kept() == {ref.sha256}
    assert history._db.execute("SELECT COUNT(*) FROM message_attachments").fetchone()[0] == 2
    (first, _) = history.conversation("a").messages  # type: ignore[union-attr]
    assert first.attachments == (ref,)
    assert history.attachments_of("b") == [ref]
    history.delete("a")
    assert history.attachments.kept() == {ref.sha256}  # b still uses it
    history.delete("b")
    assert history.attachments.kept() == set()


def test_a_file_held_for_a_message_on_its_way_survives_another_chat_deleted_meanwhile(
    history: History, tmp_path: Path
) -> None:
    source = tmp_path / "notes.md"
    source.write_text("# Shared notes\n")
    ref = _attach(history, source)
    history.create_conversation("old")
    history.sync_messages("old", [("user", "look"), ("assistant", "ok")], [[ref]])
    # A new message carries the same file: held (as the keeper does when it asks to keep it), kept (as
    # the bridge does), and the old chat deleted before the new message is saved.
    history.attachments.hold([ref.sha256])
    history.attachments.put(source.read_bytes())
    history.delete("old")
    assert history.attachments.kept() == {ref.sha256}
    history.create_conversation("new")
    history.sync_messages("new", [("user", "look again")], [[ref]])
    history.release_attachments([ref.sha256])  # saved: its reference keeps it now
    assert history.attachments.kept() == {ref.sha256}
    history.delete("new")
    assert history.attachments.kept() == set()


def test_files_of_a_message_that_never_went_are_collected(history: History, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("dropped at send")
    (tmp_path / "b.txt").write_text("kept by a run that ended")
    (tmp_path / "c.txt").write_text("in a saved chat")
    c = _attach(history, tmp_path / "c.txt")
    history.create_conversation("chat")
    history.sync_messages("chat", [("user", "read")], [[c]])
    a = ingest(tmp_path / "a.txt").ref.sha256
    history.attachments.hold([a])
    history.attachments.put((tmp_path / "a.txt").read_bytes())
    history.release_attachments([a])  # stopped before it went
    assert history.attachments.kept() == {c.sha256}
    b = _attach(history, tmp_path / "b.txt")  # written, and the app ended before its message was saved
    again = History(history.path)  # the next run's
    try:
        assert again.attachments.kept() == {b.sha256, c.sha256}
        again.collect_unused()
        assert again.attachments.kept() == {c.sha256}
    finally:
        again.close()


def test_an_edit_that_drops_the_message_drops_its_attachment(history: History, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("first file")
    (tmp_path / "b.txt").write_text("second file")
    a, b = _attach(history, tmp_path / "a.txt"), _attach(history, tmp_path / "b.txt")
    history.create_conversation("c")
    history.sync_messages("c", [("user", "read"), ("assistant", "done")], [[a]])
    # Edit-and-resend: same text, another file: the message is replaced, a's file goes.
    history.sync_messages("c", [("user", "read")], [[b]])
    (message,) = history.conversation("c").messages  # type: ignore[union-attr]
    assert message.attachments == (b,)
    assert history.attachments.kept() == {b.sha256}


def test_export_has_the_attachments(history: History, tmp_path: Path) -> None:
    doc = _attach(history, write_pdf(tmp_path / "My Report (final).pdf", ["Findings: all good"]))
    image = _attach(history, write_image(tmp_path / "chart.png", 20, 10))
    history.create_conversation("c", "Report chat")
    history.sync_messages("c", [("user", "Summarise")], [[doc, image]])
    out = tmp_path / "out"
    out.mkdir()
    history.export_json("c", out / "chat.json")
    data = json.loads((out / "chat.json").read_text())
    listed = data["messages"][0]["attachments"]
    assert [a["name"] for a in listed] == ["My Report (final).pdf", "chart.png"]
    files = [out / a["file"] for a in listed]
    assert all(f.parent == out / "chat-attachments" for f in files)
    assert "Findings: all good" in files[0].read_text()
    assert files[0].name.endswith("My_Report_final_.pdf.txt")  # a PDF kept as its text
    assert files[1].read_bytes() == (tmp_path / "chart.png").read_bytes()
    history.export_markdown("c", out / "chat.md")
    markdown = (out / "chat.md").read_text()
    assert f"- Attached: [My Report (final).pdf](<chat-attachments/{files[0].name}>)" in markdown
    assert f"- Attached: ![chart.png](<chat-attachments/{files[1].name}>)" in markdown


def test_a_damaged_or_missing_file_is_said_not_raised(history: History, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("the original")
    (tmp_path / "b.txt").write_text("the other")
    a, b = _attach(history, tmp_path / "a.txt"), _attach(history, tmp_path / "b.txt")
    history.attachments.path(a.sha256).write_text("tampered")
    history.attachments.path(b.sha256).unlink()
    assert history.attachments.read(a.sha256) is Unreadable.DAMAGED
    assert history.attachments.read(b.sha256) is Unreadable.MISSING
    history.create_conversation("c")
    history.sync_messages("c", [("user", "both")], [[a, b]])
    history.export_markdown("c", tmp_path / "c.md")
    text = (tmp_path / "c.md").read_text()
    assert "- Attached: a.txt (its file is missing or damaged in the app's folder)" in text
    assert "- Attached: b.txt (its file is missing or damaged in the app's folder)" in text


def test_a_reference_a_hand_edit_broke_is_left_out(history: History, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("kept")
    a = _attach(history, tmp_path / "a.txt")
    history.create_conversation("c")
    history.sync_messages("c", [("user", "x")], [[a]])
    history._db.execute("UPDATE message_attachments SET ref = 'not json'")
    (message,) = history.conversation("c").messages  # type: ignore[union-attr]
    assert message.attachments == ()


def test_a_version_2_database_gains_attachments(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(f"{_SCHEMA_V1}; {_RUN_CARD_V2}; PRAGMA user_version = 2;")
    db.execute("INSERT INTO conversations (id, title, created_at, updated_at) VALUES ('c', 'Old', 1, 1)")
    db.execute(
        "INSERT INTO messages (conversation_id, position, role, content, state, created_at)"
        " VALUES ('c', 0, 'user', 'old question', 'complete', 1)"
    )
    db.commit()
    db.close()
    history = History(path)
    try:
        assert "message_attachments" in _ATTACHMENTS_V4
        assert history._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        (old,) = history.conversation("c").messages  # type: ignore[union-attr]
        assert (old.content, old.attachments) == ("old question", ())
        (tmp_path / "n.txt").write_text("new")
        ref = _attach(history, tmp_path / "n.txt")
        history.sync_messages("c", [("user", "old question"), ("user", "with a file")], [[], [ref]])
        assert history.conversation("c").messages[1].attachments == (ref,)  # type: ignore[union-attr]
    finally:
        history.close()


def test_a_model_without_vision_is_refused_naming_one_with() -> None:
    from app.core.attachments import vision_refusal

    assert vision_refusal("Qwen3-0.6B-GGUF", True, []) == ""
    assert vision_refusal("Qwen3-0.6B-GGUF", False, ["SmolVLM-256M-Instruct-GGUF"]) == (
        "Qwen3-0.6B-GGUF cannot take images: it has no vision projector (mmproj). "
        "SmolVLM-256M-Instruct-GGUF can: choose it in the Models list to send pictures."
    )
    assert vision_refusal("m", False, []).endswith(
        "Add a model with a vision projector (labelled vision) to send pictures."
    )
    assert vision_refusal("", False, ["v"]).startswith(
        "No model is chosen, so the message cannot take images."
    )


def test_the_catalog_has_a_vision_model_with_its_projector_and_an_embeddings_model() -> None:
    from app.core.models import catalog_from_json
    from app.store.catalog import load_catalog_json

    models = catalog_from_json(load_catalog_json())
    vision = models["SmolVLM-256M-Instruct-GGUF"]
    assert vision.checkpoint == "ggml-org/SmolVLM-256M-Instruct-GGUF:Q8_0"
    assert vision.mmproj == "mmproj-SmolVLM-256M-Instruct-Q8_0.gguf" and "vision" in vision.labels
    assert "embeddings" in models["nomic-embed-text-v1-GGUF"].labels


def test_an_engine_that_cannot_count_gives_an_estimate_said_to_be_one(
    standin_settings: Settings, tmp_path: Path
) -> None:
    """The stand-in engine has no ``/tokenize`` (it answers 404): the count is an estimate, with the
    context the engine was loaded with; a model not loaded is never loaded to count."""

    async def go() -> None:
        async with Router(standin_settings) as router:
            model = router.library.import_path(make_standin_model(tmp_path, "counting"))
            router.save_options(model.name, ModelOptions(backend="system", ctx_size=3072))
            before = await router.count_tokens(model.name, "x" * 400)
            assert (before.tokens, before.exact, before.context) == (100, False, 3072)
            assert router.loaded() == []
            await router.ensure_loaded(model.name)
            after = await router.count_tokens(model.name, "x" * 400)
            assert (after.tokens, after.exact, after.context) == (100, False, 3072)
            assert after.label() == "≈100 tokens (estimate)"

    asyncio.run(go())


# --- retrieval: chunks, ranking, what the model is told -------------------------------------------------


def test_chunks_cover_the_text_end_at_lines_and_overlap() -> None:
    from app.core.attachments import CHUNK_CHARS, CHUNK_OVERLAP, chunk_spans

    text = long_text(10)
    spans = chunk_spans(text)
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end - CHUNK_OVERLAP <= start < end  # each overlaps the one before
    assert all(end - start <= CHUNK_CHARS for start, end in spans)
    assert all(text[end - 1] == "\n" for _, end in spans)  # lines stay whole
    assert chunk_spans("") == [] and chunk_spans("short") == [(0, 5)]


def test_the_best_scored_chunks_that_fit_go_in_the_texts_order() -> None:
    from app.core.attachments import cosine, pick_spans

    spans = [(0, 100), (90, 200), (200, 300), (300, 400)]
    assert pick_spans(spans, [0.1, 0.9, 0.2, 0.8], 250) == ((90, 200), (300, 400))
    assert pick_spans(spans, [0.9, 0.8, 0.1, 0.1], 250) == ((0, 200),)  # overlapping ones merged
    assert pick_spans(spans, [1, 1, 1, 1], 10) == ()
    assert cosine([1, 0], [1, 0]) == 1.0 and cosine([1, 0], [0, 1]) == 0.0 and cosine([0, 0], [1, 1]) == 0.0


def test_retrieved_parts_are_named_as_such_and_kept_in_the_history(history: History, tmp_path: Path) -> None:
    text = "alpha " * 100 + "beta " * 100 + "gamma " * 100
    (tmp_path / "doc.txt").write_text(text)
    ref = _attach(history, tmp_path / "doc.txt").retrieved(((0, 60), (600, 650)))
    content = message_content("Which words?", [(ref, text.encode())])
    assert isinstance(content, str)
    assert (
        "only 2 parts of it, 110 of 1,700 characters: those most related to the question, found by retrieval"
        in content
    )
    assert "alpha " * 10 + "\n[…]\nbeta " in content and "gamma" not in content
    history.create_conversation("c")
    history.sync_messages("c", [("user", "Which words?")], [[ref]])
    (message,) = history.conversation("c").messages  # type: ignore[union-attr]
    assert message.attachments == (ref,) and ref.sent_spans == ((0, 60), (600, 650))
    with pytest.raises(ValueError):
        AttachmentRef.from_json({**ref.to_json(), "sent_spans": [[0, "x"]]})
