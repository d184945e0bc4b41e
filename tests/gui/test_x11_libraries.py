"""Before Qt starts on X11, the app checks that Qt's X11 plugin loads, and names a missing system library
(Qt itself aborts with a list of plugins). The plugin here is a stand-in: a real shared library, built
with gcc, linked against a library that is then taken away, so that dlopen fails on it as it does on
Qt's own ``libqxcb.so`` on a machine without ``libxcb-cursor0``. The missing libraries' names are made
up (a real one may be installed here), and named like real ones: ``libxcb-cursor.so.0`` is in the
Debian package ``libxcb-cursor0``, ``libxkbcommon-x11.so.0`` in ``libxkbcommon-x11-0``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.errors import UnsupportedError
from app.ui.launch import check_x11_libraries

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="builds its stand-in plugin with gcc")

X11 = {"DISPLAY": ":99"}


def plugin_needing(tmp_path: Path, soname: str | None) -> Path:
    """A shared library named like Qt's X11 plugin that needs ``soname``, which is not there (None: one
    that needs nothing more)."""
    plugin = tmp_path / "libqxcb.so"
    if soname is None:
        (tmp_path / "plugin.c").write_text("int plugin(void) { return 0; }\n")
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", plugin, tmp_path / "plugin.c"], check=True)
        return plugin
    stub = tmp_path / soname
    (tmp_path / "stub.c").write_text("int stub(void) { return 0; }\n")
    (tmp_path / "plugin.c").write_text("int stub(void);\nint plugin(void) { return stub(); }\n")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", stub, tmp_path / "stub.c"], check=True
    )
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", plugin, tmp_path / "plugin.c", stub], check=True)
    stub.unlink()
    return plugin


@pytest.mark.parametrize(
    ("soname", "package"),
    [("libxcb-lemontest.so.0", "libxcb-lemontest0"), ("liblemontest-x11.so.0", "liblemontest-x11-0")],
)
def test_a_missing_library_is_named_with_its_package(tmp_path: Path, soname: str, package: str) -> None:
    with pytest.raises(UnsupportedError) as refused:
        check_x11_libraries(plugin_needing(tmp_path, soname), X11)
    assert f"needs the system library {soname}, which is not installed" in refused.value.message
    assert f"sudo apt install {package} " in refused.value.hint


@pytest.mark.parametrize(
    "environ",
    [
        {"DISPLAY": ":99", "QT_QPA_PLATFORM": "offscreen"},
        {"DISPLAY": ":99", "WAYLAND_DISPLAY": "wayland-0"},  # Qt may use Wayland
        {},  # no display: Qt says so itself
    ],
)
def test_nothing_is_checked_where_qt_would_not_use_x11(tmp_path: Path, environ: dict[str, str]) -> None:
    check_x11_libraries(plugin_needing(tmp_path, "libxcb-lemontest.so.0"), environ)


def test_a_plugin_that_loads_passes(tmp_path: Path) -> None:
    check_x11_libraries(plugin_needing(tmp_path, None), {**X11, "QT_QPA_PLATFORM": "xcb"})


def test_the_command_says_so_and_exits_1_before_qt_starts(tmp_path: Path) -> None:
    plugin = plugin_needing(tmp_path, "libxcb-lemontest.so.0")
    code = (
        "import sys\nfrom pathlib import Path\nimport app.ui.launch as launch\n"
        f"launch.x11_plugin = lambda: Path({str(plugin)!r})\n"
        "from app.cli import main\nsys.exit(main([]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY")}
    done = subprocess.run(
        [sys.executable, "-c", code], env={**env, **X11}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("error: The window cannot open: Qt's X11 support needs the system library")
    assert "sudo apt install libxcb-lemontest0" in done.stderr
    assert "qt.qpa" not in done.stderr and "Traceback" not in done.stderr
