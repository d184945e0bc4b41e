"""``lemon-desk --install-desktop-entry``: a freedesktop launcher entry and icons for the current user.

Writes ``$XDG_DATA_HOME/applications/lemon-desk.desktop`` (default ``~/.local/share``) and the app icon
into ``$XDG_DATA_HOME/icons/hicolor/``, so the app starts from the launcher with a double-click.
"""

from __future__ import annotations

import os
import sys
from importlib import resources
from pathlib import Path

from app.core.errors import UnsupportedError
from app.store.files import atomic_write_bytes

ENTRY_NAME = "lemon-desk.desktop"
ICON_NAME = "lemon-desk"
PNG_SIZES = (16, 32, 48, 64, 128, 256)


def packaging_dir() -> Path:
    """packaging/: inside the installed package (a wheel), else beside ``app/`` (a source checkout)."""
    installed = Path(str(resources.files("app"))) / "packaging"
    return installed if installed.is_dir() else Path(__file__).resolve().parent.parent / "packaging"


def data_home() -> Path:
    value = os.environ.get("XDG_DATA_HOME", "")
    return Path(value) if os.path.isabs(value) else Path.home() / ".local" / "share"


def _quote(arg: str) -> str:
    """An Exec argument, quoted as the Desktop Entry spec asks when it holds reserved characters."""
    if arg and not any(c in arg for c in " \t\n\"'\\><~|&;$*?#()`%"):
        return arg
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`").replace("$", "\\$")
    return f'"{escaped}"'.replace("%", "%%")


def exec_line() -> str:
    """How the launcher starts the app: a frozen bundle's own executable, else this environment's
    ``lemon-desk`` script, else ``python -m app``."""
    script = Path(sys.executable).with_name("lemon-desk")
    if getattr(sys, "frozen", False):
        argv = [str(Path(sys.executable).resolve())]
    else:
        argv = [str(script)] if script.is_file() else [sys.executable, "-m", "app"]
    return " ".join(_quote(a) for a in argv)


def install_desktop_entry() -> list[Path]:
    """Write the entry and icons; returns the files written."""
    if sys.platform == "darwin":
        raise UnsupportedError(
            "Desktop entries are for Linux launchers.", "On macOS, start Lemon Desk from its app bundle."
        )
    source = packaging_dir()
    target = data_home()
    template = (source / f"{ENTRY_NAME}.in").read_text()
    written = [target / "applications" / ENTRY_NAME]
    atomic_write_bytes(written[0], template.replace("@EXEC@", exec_line()).encode())
    svg = target / "icons" / "hicolor" / "scalable" / "apps" / f"{ICON_NAME}.svg"
    atomic_write_bytes(svg, (source / "icons" / f"{ICON_NAME}.svg").read_bytes())
    written.append(svg)
    for size in PNG_SIZES:
        png = target / "icons" / "hicolor" / f"{size}x{size}" / "apps" / f"{ICON_NAME}.png"
        atomic_write_bytes(png, (source / "icons" / f"{ICON_NAME}-{size}.png").read_bytes())
        written.append(png)
    return written
