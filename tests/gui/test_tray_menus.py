"""The tray's menus are built again only when what they show changed: the window passes its rows on
every change of any model's status, and a menu built again for nothing costs the app its objects."""

from __future__ import annotations

from PySide6.QtGui import QIcon
from pytestqt.qtbot import QtBot

from app.ui.tray import Tray


def test_the_menus_are_built_again_only_when_their_content_changed(qtbot: QtBot) -> None:
    tray = Tray(QIcon())
    tray.set_models(["user.a", "user.b"], {"user.a"}, frozenset({"user.b"}))
    built = [*tray.load_menu.actions(), *tray.unload_menu.actions(), *tray.pin_menu.actions()]
    tray.set_models(["user.a", "user.b"], {"user.a"}, frozenset({"user.b"}))
    assert [*tray.load_menu.actions(), *tray.unload_menu.actions(), *tray.pin_menu.actions()] == built
    tray.set_models(["user.a", "user.b"], {"user.a", "user.b"}, frozenset({"user.b"}))
    assert tray.load_actions()["user.b"].isChecked() and "user.b" in tray.unload_actions()
    tray.set_remote_models(["@box/qwen"], set())
    assert "@box/qwen" in tray.load_actions()


def test_a_pin_that_failed_is_unchecked_again_with_the_menus_unchanged(qtbot: QtBot) -> None:
    tray = Tray(QIcon())
    tray.set_models(["user.a"], set())
    (pin,) = tray.pin_menu.actions()
    pin.trigger()  # Qt checks it at once; the pin then failed, so the window's rows are as they were
    assert pin.isChecked()
    tray.set_models(["user.a"], set())
    assert not pin.isChecked() and tray.pin_menu.actions() == [pin]
