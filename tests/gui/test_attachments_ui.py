"""Attachments in the window: the file dialog, drops and pastes reach the composer; chips show what is
attached and its token count; what does not fit is said with its choices; images are refused for a model
without a projector; and, through the real bridge and router (the stand-in engine), a file is kept at
send time, listed with the chat, shown again when the chat is, said when damaged, and deleted with it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QGuiApplication, QImage
from PySide6.QtWidgets import QApplication, QFileDialog
from pytestqt.qtbot import QtBot

from app.core.attachments import AttachmentKind, TokenCount
from app.core.chat import ChatMessage, MessageState
from app.store.attachments import ingest
from app.store.settings import Settings, save_settings
from app.ui.chat.pane import ChatPane, PaneState
from app.ui.desktop import DesktopApp
from tests.gui import test_bridge
from tests.support.documents import long_text, write_image, write_pdf
from tests.support.standin import make_standin_model

Desktop = Callable[[], DesktopApp]
opened_files = test_bridge.opened_files  # a fixture: the files opened, by thread (Python's audit hook)


def make_pane(qtbot: QtBot) -> ChatPane:
    pane = ChatPane()
    qtbot.addWidget(pane)
    pane.resize(900, 700)
    pane.show()
    qtbot.waitExposed(pane)
    pane.activateWindow()
    qtbot.waitUntil(pane.isActiveWindow)
    pane.composer.setFocus()
    return pane


def _drop(widget: object, paths: list[Path]) -> None:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    action = Qt.DropAction.CopyAction
    buttons, keys = Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
    enter = QDragEnterEvent(QPoint(20, 10), action, mime, buttons, keys)
    QApplication.sendEvent(widget, enter)  # type: ignore[arg-type]
    assert enter.isAccepted()
    QApplication.sendEvent(widget, QDropEvent(QPointF(20, 10), action, mime, buttons, keys))  # type: ignore[arg-type]


def test_the_attach_button_opens_a_file_dialog_and_asks_for_the_chosen_files(
    qtbot: QtBot, tmp_path: Path
) -> None:
    pane = make_pane(qtbot)
    doc = tmp_path / "notes.md"
    doc.write_text("# Notes\n")
    pane.attach_button.click()
    dialog = pane.file_dialog
    assert isinstance(dialog, QFileDialog) and dialog.isVisible()
    dialog.setOption(QFileDialog.Option.DontUseNativeDialog)
    dialog.setDirectory(str(tmp_path))
    dialog.selectFile(str(doc))
    with qtbot.waitSignal(pane.attach_requested) as asked:
        dialog.accept()
    assert Path(asked.args[0]) == doc


def test_files_dropped_on_the_composer_or_the_pane_are_attached_not_typed(
    qtbot: QtBot, tmp_path: Path
) -> None:
    pane = make_pane(qtbot)
    a, b = tmp_path / "a.py", tmp_path / "b.csv"
    a.write_text("print(1)\n")
    b.write_text("x,y\n1,2\n")
    asked: list[str] = []
    pane.attach_requested.connect(asked.append)
    _drop(pane.composer.viewport(), [a])
    _drop(pane.transcript.viewport(), [b])  # anywhere on the pane
    assert [Path(p) for p in asked] == [a, b]
    assert pane.composer.toPlainText() == ""


def test_a_pasted_image_is_attached_as_png(qtbot: QtBot) -> None:
    pane = make_pane(qtbot)
    image = QImage(64, 32, QImage.Format.Format_RGB32)
    image.fill(Qt.GlobalColor.darkCyan)
    QGuiApplication.clipboard().setImage(image)
    pane.composer.setFocus()
    with qtbot.waitSignal(pane.attach_data_requested) as pasted:
        qtbot.keyClick(pane.composer, Qt.Key.Key_V, Qt.KeyboardModifier.ControlModifier)
    name, data = pasted.args
    assert name.endswith(".png") and data.startswith(b"\x89PNG")
    decoded = QImage.fromData(data)
    assert (decoded.width(), decoded.height()) == (64, 32)
    assert pane.composer.toPlainText() == ""


def test_an_image_is_refused_before_sending_for_a_model_without_vision(qtbot: QtBot, tmp_path: Path) -> None:
    pane = make_pane(qtbot)
    refusal = "tiny cannot take images: it has no vision projector (mmproj). SmolVLM-256M-Instruct-GGUF can."
    pane.set_vision(refusal)
    asked: list[str] = []
    pane.attach_requested.connect(asked.append)
    pane.attach_files([str(write_image(tmp_path / "cat.png", 16, 16))])
    assert asked == []
    assert pane.tray.notice.isVisible() and refusal in pane.tray.notice.text()
    QGuiApplication.clipboard().setImage(QImage(8, 8, QImage.Format.Format_RGB32))
    pasted: list[object] = []
    pane.attach_data_requested.connect(lambda *args: pasted.append(args))
    qtbot.keyClick(pane.composer, Qt.Key.Key_V, Qt.KeyboardModifier.ControlModifier)
    assert pasted == [] and "The pasted image was not attached" in pane.tray.notice.text()
    # An image attached while the model could see it is refused at send if the model changed since.
    pane.set_vision("")
    pane.add_attachment(ingest(tmp_path / "cat.png"), TokenCount(256, exact=False))
    pane.set_vision(refusal)
    pane.composer.setPlainText("what is this?")
    sent: list[object] = []
    pane.send_requested.connect(lambda *args: sent.append(args))
    pane.keep_requested.connect(lambda *args: sent.append(args))
    pane.submit()
    assert sent == [] and refusal in pane.tray.notice.text()


def test_chips_show_the_count_and_a_removed_one_is_not_sent(qtbot: QtBot, tmp_path: Path) -> None:
    pane = make_pane(qtbot)
    (tmp_path / "keep.txt").write_text("kept text")
    (tmp_path / "drop.txt").write_text("dropped text")
    pane.add_attachment(ingest(tmp_path / "keep.txt"), TokenCount(3, exact=True, context=4096))
    pane.add_attachment(ingest(tmp_path / "drop.txt"), TokenCount(40, exact=False, context=4096))
    first, second = pane.tray.row.chips
    assert first.detail.text() == "3 tokens"
    assert second.detail.text() == "≈40 tokens (estimate)"
    second.remove_button.click()
    assert [p.ref.name for p in pane.tray.items] == ["keep.txt"]
    pane.composer.setPlainText("read it")
    with qtbot.waitSignal(pane.keep_requested) as keep:
        pane.submit()
    assert pane.state is PaneState.KEEPING
    assert [(t.ref.name, ref.name, budget) for t, ref, budget in keep.args[0]] == [
        ("keep.txt", "keep.txt", None)
    ]
    assert keep.args[1] == "read it"
    with qtbot.waitSignal(pane.send_requested) as sent:
        pane.attachments_kept([p.ref for p in pane.tray.items])
    (user,) = sent.args[1]
    assert user["content"] == "read it"
    assert [r.name for r in user["attachments"]] == ["keep.txt"]
    assert pane.tray.items == [] and not pane.tray.row.isVisible()
    view = pane.transcript.views()[0]
    assert [c.ref.name for c in view.attachments.chips] == ["keep.txt"]


def test_a_file_bigger_than_the_context_is_never_cut_silently(qtbot: QtBot, tmp_path: Path) -> None:
    pane = make_pane(qtbot)
    book = tmp_path / "book.txt"
    book.write_text(long_text(200))  # ~600,000 characters
    taken = ingest(book)
    pane.add_attachment(taken, TokenCount(150_000, exact=True, context=8192))
    notice = pane.tray.notice.text()
    assert "The attachments are 150,000 tokens" in notice
    assert "do not fit the 8,192-token context" in notice
    assert pane.tray.fit_button.isVisible() and pane.tray.larger_button.isVisible()
    pane.composer.setPlainText("Summarise the book")
    asked: list[object] = []
    pane.keep_requested.connect(lambda *args: asked.append(args))
    pane.submit()
    assert asked == [] and pane.state is PaneState.IDLE  # it waits for a choice
    with qtbot.waitSignal(pane.context_wanted) as wanted:
        pane.tray.larger_button.click()
    assert wanted.args[0] > 150_000
    pane.tray.fit_button.click()
    (pending,) = pane.tray.items
    assert pending.ref.sent_chars is not None and 0 < pending.ref.sent_chars < len(taken.text)
    assert "only the part that fits" in pane.tray.row.chips[0].detail.text()
    with qtbot.waitSignal(pane.keep_requested):
        pane.submit()
    with qtbot.waitSignal(pane.send_requested) as sent:
        pane.attachments_kept([p.ref for p in pane.tray.items])
    (ref,) = sent.args[1][0]["attachments"]
    assert ref.sent_chars == pending.ref.sent_chars


# --- through the bridge and the router, with the stand-in engine ---------------------------------------


def _with_model(qtbot: QtBot, desktop: Desktop, standin_settings: Settings, tmp_path: Path) -> DesktopApp:
    save_settings(dataclasses.replace(standin_settings, api_enabled=False))
    app = desktop()
    with qtbot.waitSignal(app.bridge.model_added) as added:
        app.bridge.import_model(str(make_standin_model(tmp_path / "models", "plain", tokens=3)))
    name = added.args[0]
    app.bridge.save_options(name, dataclasses.replace(app.bridge.options(name), backend="system"))
    app.window.models.select(name)
    return app


def test_a_file_that_vanishes_after_attaching_is_said_at_send_time(
    qtbot: QtBot, desktop: Desktop, standin_settings: Settings, tmp_path: Path
) -> None:
    app = _with_model(qtbot, desktop, standin_settings, tmp_path)
    chat = app.window.chat
    doc = tmp_path / "draft.txt"
    doc.write_text("a draft that will be moved away")
    with qtbot.waitSignal(app.bridge.attachment_ready):
        chat.attach_files([str(doc)])
    (chip,) = chat.tray.row.chips
    assert "(estimate)" in chip.detail.text()  # the model is not loaded: nothing could count it
    doc.unlink()
    chat.composer.setPlainText("look at the draft")
    with qtbot.waitSignal(app.bridge.attachment_refused) as refused:
        chat.submit()
    assert refused.args[0].startswith(f"draft.txt is gone from {tmp_path} since it was attached")
    assert refused.args[0] in chat.tray.notice.text()
    assert chat.state is PaneState.IDLE
    assert chat.messages() == [] and chat.composer.toPlainText() == "look at the draft"
    assert app.history.attachments.kept() == set()


def test_a_binary_renamed_txt_is_refused_clearly_in_the_composer(
    qtbot: QtBot, desktop: Desktop, standin_settings: Settings, tmp_path: Path
) -> None:
    app = _with_model(qtbot, desktop, standin_settings, tmp_path)
    fake = tmp_path / "report.txt"
    fake.write_bytes(b"\x7fELF\x02\x01\x01\0" + bytes(range(256)) * 8)
    with qtbot.waitSignal(app.bridge.attachment_refused):
        app.window.chat.attach_files([str(fake)])
    text = app.window.chat.tray.notice.text()
    assert "report.txt was not attached: its content is binary, not text" in text
    assert app.window.chat.tray.items == []


def test_attachments_are_kept_listed_shown_again_said_when_damaged_and_deleted_with_the_chat(
    qtbot: QtBot, desktop: Desktop, standin_settings: Settings, tmp_path: Path
) -> None:
    app = _with_model(qtbot, desktop, standin_settings, tmp_path)
    chat, history = app.window.chat, app.history
    pdf = write_pdf(tmp_path / "minutes.pdf", ["Minutes of the meeting", "Decisions: ship it"])
    with qtbot.waitSignal(app.bridge.attachment_ready):
        chat.attach_files([str(pdf)])
    chat.composer.setPlainText("What was decided?")
    chat.submit()
    qtbot.waitUntil(lambda: len(chat.messages()) == 2, timeout=30_000)
    qtbot.waitUntil(lambda: chat.messages()[-1].state is not MessageState.STREAMING, timeout=120_000)
    assert chat.messages()[-1].state is MessageState.COMPLETE
    chat_id = chat.conversation_id
    (ref,) = history.attachments_of(chat_id)
    assert (ref.name, ref.kind) == ("minutes.pdf", AttachmentKind.TEXT)
    assert history.attachments.kept() == {ref.sha256}
    assert b"Decisions: ship it" in history.attachments.path(ref.sha256).read_bytes()
    # Shown again with the chat; then its file damaged: said in the transcript, not a crash.
    chat.new_conversation()
    with qtbot.waitSignal(app.bridge.attachment_read):
        app.keeper.open(chat_id)
    (chip,) = chat.transcript.views()[0].attachments.chips
    assert chip.ref == ref and "tokens" not in chip.detail.text()
    history.attachments.path(ref.sha256).write_bytes(b"tampered")
    chat.new_conversation()
    with qtbot.waitSignal(app.bridge.attachment_read):
        app.keeper.open(chat_id)
    (chip,) = chat.transcript.views()[0].attachments.chips
    assert chip.detail.text() == (
        "minutes.pdf: the attachment's file is damaged (its content no longer matches what was attached)."
    )
    app.keeper._delete(chat_id)
    assert history.attachments.kept() == set()


def test_files_are_held_while_their_message_is_on_its_way_and_go_when_it_is_stopped_there(
    qtbot: QtBot, desktop: Desktop, standin_settings: Settings, tmp_path: Path
) -> None:
    """Held from the send until the message is saved, so deleting another chat that used the same file
    cannot take it meanwhile; a message stopped while its files are kept never goes, and they go."""
    app = _with_model(qtbot, desktop, standin_settings, tmp_path)
    chat, history = app.window.chat, app.history
    doc = tmp_path / "plan.md"
    doc.write_text("# The plan\n")
    with qtbot.waitSignal(app.bridge.attachment_ready):
        chat.attach_files([str(doc)])
    (sha,) = [item.ref.sha256 for item in chat.tray.items]
    chat.composer.setPlainText("Read the plan")
    chat.submit()
    assert chat.state is PaneState.KEEPING and history.attachments.held(sha)
    with qtbot.waitSignal(app.bridge.attachments_kept, timeout=30_000):
        chat.stop()  # before the bridge kept them: it keeps them after, for a message that did not go
    assert not history.attachments.held(sha) and history.attachments.kept() == set()
    assert chat.messages() == [] and not history.list_conversations()

    chat.submit()  # sent this time: held until saved, then its reference keeps it
    assert history.attachments.held(sha)
    qtbot.waitUntil(lambda: len(chat.messages()) == 2, timeout=30_000)
    assert not history.attachments.held(sha) and history.attachments.kept() == {sha}
    qtbot.waitUntil(lambda: chat.messages()[-1].state is not MessageState.STREAMING, timeout=120_000)


def test_an_edited_message_keeps_its_attachments(qtbot: QtBot, tmp_path: Path) -> None:
    pane = make_pane(qtbot)
    (tmp_path / "spec.md").write_text("# Spec\n")
    pane.add_attachment(ingest(tmp_path / "spec.md"), TokenCount(4, exact=True, context=4096))
    pane.composer.setPlainText("review this")
    with qtbot.waitSignal(pane.keep_requested):
        pane.submit()
    with qtbot.waitSignal(pane.send_requested):
        pane.attachments_kept([p.ref for p in pane.tray.items])
    pane.begin_reply()
    pane.finish_reply()
    pane.edit(0)
    assert pane.edit_banner.text().startswith("Editing a message (its attachment goes with it)")
    pane.composer.setPlainText("review this, briefly")
    with qtbot.waitSignal(pane.send_requested) as sent:
        pane.submit()
    (user,) = sent.args[1]
    assert user["content"] == "review this, briefly"
    assert [r.name for r in user["attachments"]] == ["spec.md"]


def test_the_window_names_a_model_that_takes_images_when_the_chosen_one_does_not(
    qtbot: QtBot, desktop: Desktop, standin_settings: Settings, tmp_path: Path
) -> None:
    app = _with_model(qtbot, desktop, standin_settings, tmp_path)
    chat = app.window.chat
    name = app.bridge.selected
    assert chat._vision_refusal == (
        f"{name} cannot take images: it has no vision projector (mmproj). "
        "SmolVLM-256M-Instruct-GGUF can: choose it in the Models list to send pictures."
    )
    asked: list[str] = []
    chat.attach_requested.connect(asked.append)
    chat.attach_files([str(write_image(tmp_path / "cat.png", 8, 8))])
    assert asked == [] and chat.tray.notice.text().startswith("cat.png was not attached: ")


def test_attaching_keeping_and_showing_read_no_file_on_the_windows_thread(
    qtbot: QtBot,
    desktop: Desktop,
    standin_settings: Settings,
    tmp_path: Path,
    lemon_home: Path,
    opened_files: list[tuple[str, str]],
) -> None:
    app = _with_model(qtbot, desktop, standin_settings, tmp_path)
    chat = app.window.chat
    (tmp_path / "docs").mkdir()
    notes = tmp_path / "docs" / "notes.csv"
    notes.write_text("item,count\napples,3\n")
    pdf = write_pdf(tmp_path / "docs" / "report.pdf", ["All is well"])
    opened_files.clear()
    for path in (notes, pdf):
        with qtbot.waitSignal(app.bridge.attachment_ready):
            chat.attach_files([str(path)])
    chat.composer.setPlainText("Read these")
    with qtbot.waitSignal(app.bridge.attachments_kept):
        chat.submit()
    qtbot.waitUntil(
        lambda: len(chat.messages()) == 2 and chat.messages()[-1].state is not MessageState.STREAMING
    )
    chat_id = chat.conversation_id
    chat.new_conversation()
    with qtbot.waitSignal(app.bridge.attachment_read):
        app.keeper.open(chat_id)
    opened = list(opened_files)
    read = {Path(p).name for _, p in opened}
    assert {"notes.csv", "report.pdf"} <= read  # read when attached
    kept = {r.sha256 for r in app.history.attachments_of(chat_id)}
    assert len(kept) == 2 and kept <= read  # kept, then read again for the transcript
    assert test_bridge.on_ui_thread(opened, app.history.attachments.root, tmp_path / "docs") == []


def test_stopping_while_the_attachments_are_kept_sends_nothing(qtbot: QtBot, tmp_path: Path) -> None:
    pane = make_pane(qtbot)
    (tmp_path / "a.txt").write_text("text")
    pane.add_attachment(ingest(tmp_path / "a.txt"), TokenCount(1, exact=True, context=4096))
    pane.composer.setPlainText("go")
    with qtbot.waitSignal(pane.keep_requested):
        pane.submit()
    assert pane.send_button.text() == "Stop"
    stops: list[object] = []
    pane.stop_requested.connect(lambda: stops.append(True))
    qtbot.keyClick(pane.composer, Qt.Key.Key_Escape)
    assert pane.state is PaneState.IDLE and pane.send_button.text() == "Send"
    sent: list[object] = []
    pane.send_requested.connect(lambda *args: sent.append(args))
    pane.attachments_kept([p.ref for p in pane.tray.items])  # the bridge's answer, late
    assert sent == [] and stops == []
    assert [p.ref.name for p in pane.tray.items] == ["a.txt"]  # still there, to send again
    pane.new_conversation()  # and a new chat while keeping is no crash either


def test_a_chat_holding_images_does_not_go_to_a_model_without_vision(qtbot: QtBot, tmp_path: Path) -> None:
    pane = make_pane(qtbot)
    photo = ingest(write_image(tmp_path / "photo.png", 8, 8))
    question = ChatMessage("user", "what is it?", attachments=[photo.ref])
    pane.show_conversation("c", "Photo", "", [question, ChatMessage("assistant", "a photo")])
    refusal = "plain cannot take images: it has no vision projector (mmproj)."
    pane.set_vision(refusal)
    sent: list[object] = []
    pane.send_requested.connect(lambda *args: sent.append(args))
    pane.composer.setPlainText("and now?")
    pane.submit()
    pane.regenerate()
    assert sent == [] and len(pane.messages()) == 2
    assert pane.tray.notice.text() == f"This chat holds images. {refusal} Or start a new chat."
    pane.set_vision("")
    with qtbot.waitSignal(pane.send_requested):
        pane.submit()
