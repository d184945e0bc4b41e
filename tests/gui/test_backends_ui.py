"""The Backends view installs llamacpp:cpu from a loopback stand-in for GitHub releases (the real archive
of the real llama-server, see tests/integration/conftest.py), with progress, and Cancel leaves nothing."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest
from pytestqt.qtbot import QtBot

from app.core.backends import BackendKey
from app.store.installs import install_dir, read_manifest
from app.store.paths import staging_dir
from app.ui.desktop import DesktopApp
from tests.integration import conftest as integration
from tests.integration.conftest import ASSET, TAG, Mirror, release_path
from tests.support.fileserver import Fault

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(sys.platform != "linux", reason="the archive holds PyPI's Linux llama-server"),
]
KEY = BackendKey("llamacpp", "cpu")
# The integration tests' fixtures: the real llama-server archive on a loopback release mirror.
llama_dir, release_tarball, mirror = (
    integration.llama_dir,
    integration.release_tarball,
    integration.mirror,
)


def test_install_from_the_backends_view_with_progress(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], mirror: Mirror
) -> None:
    app = desktop()
    app.window.backends_action.trigger()
    dialog = app.backends
    assert dialog is not None and dialog.isVisible()
    row = dialog.rows[KEY]
    assert row.state.text() == "installable" and row.version.text() == TAG
    assert row.install.isEnabled() and not row.uninstall.isEnabled()
    assert not dialog.rows[BackendKey("llamacpp", "cuda")].install.isEnabled()
    progress: list[tuple[str, int, int]] = []
    app.bridge.install_progress.connect(lambda p: progress.append((p.phase.value, p.done, p.total or 0)))
    with qtbot.waitSignal(app.bridge.install_done, timeout=120_000) as done:
        row.install.click()
        assert row.progress.isVisible() and row.cancel.isVisible() and not row.install.isEnabled()
    assert done.args == [KEY, ""]
    downloads = [(d, t) for phase, d, t in progress if phase == "downloading" and t]
    assert downloads and downloads[-1][0] == downloads[-1][1] == len(mirror.tarball)
    qtbot.waitUntil(lambda: row.state.text() == "installed")
    assert not row.progress.isVisible() and row.message.text() == "Installed."
    assert row.uninstall.isEnabled() and not row.install.isEnabled()
    manifest = read_manifest(install_dir("llamacpp", "cpu"))
    assert manifest is not None and manifest.version == TAG

    row.uninstall.click()
    qtbot.waitUntil(lambda: row.state.text() == "installable")
    assert not install_dir("llamacpp", "cpu").exists()


def test_cancel_leaves_nothing_installed(
    qtbot: QtBot, desktop: Callable[[], DesktopApp], mirror: Mirror
) -> None:
    mirror.served.arm(release_path(TAG, ASSET), Fault(hold_after=len(mirror.tarball) // 3))
    app = desktop()
    app.open_backends()
    assert app.backends is not None
    row = app.backends.rows[KEY]
    try:
        with qtbot.waitSignal(
            app.bridge.install_progress, timeout=60_000, check_params_cb=lambda p: p.done > 0
        ):
            row.install.click()
        assert row.progress.isVisible() and row.progress.value() > 0
        with qtbot.waitSignal(app.bridge.install_done, timeout=60_000) as done:
            row.cancel.click()
    finally:
        mirror.served.release.set()
    assert done.args == [KEY, "Cancelled: nothing was installed."]
    assert row.message.text() == "Cancelled: nothing was installed."
    assert not row.progress.isVisible() and not row.cancel.isVisible()
    assert not install_dir("llamacpp", "cpu").exists() and not staging_dir().exists()
    qtbot.waitUntil(lambda: row.install.isEnabled())  # once the backends are read again
    assert row.state.text() == "installable"
