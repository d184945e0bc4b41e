"""Started with no display (over SSH, from a service), the window says so in one line and points to the
commands that need none: exit 1, no abort. Without the check, Qt aborts (exit 134) blaming xcb-cursor0."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from app.core.errors import UnsupportedError
from app.ui.launch import check_display

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="a display is a Linux matter")


def test_the_window_without_a_display_says_so_and_exits_1() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    done = subprocess.run(
        [sys.executable, "-m", "app"], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "there is no display (DISPLAY and WAYLAND_DISPLAY not set" in lines[0]
    assert "lemon-desk serve" in lines[0] and "lemon-desk run MODEL" in lines[0]


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({}, "DISPLAY and WAYLAND_DISPLAY"),
        ({"QT_QPA_PLATFORM": "xcb", "WAYLAND_DISPLAY": "wayland-0"}, "DISPLAY"),
        ({"QT_QPA_PLATFORM": "wayland", "DISPLAY": ":0"}, "WAYLAND_DISPLAY"),
        ({"DISPLAY": ""}, "DISPLAY and WAYLAND_DISPLAY"),
    ],
)
def test_no_display_for_the_platform_is_refused_naming_the_variable(
    environ: dict[str, str], named: str
) -> None:
    with pytest.raises(UnsupportedError) as refused:
        check_display(environ)
    assert f"({named} not set;" in refused.value.message


@pytest.mark.parametrize(
    "environ",
    [
        {"DISPLAY": ":0"},
        {"WAYLAND_DISPLAY": "wayland-0"},
        {"QT_QPA_PLATFORM": "offscreen"},
        {"QT_QPA_PLATFORM": "vnc:size=800x600"},
        {"QT_QPA_PLATFORM": "xcb", "DISPLAY": "localhost:10.0"},
    ],
)
def test_a_display_or_a_screenless_platform_passes(environ: dict[str, str]) -> None:
    check_display(environ)
