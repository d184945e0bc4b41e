"""The window's start-up path leaves the heavy libraries for later (see tests/bench/startup.py)."""

from __future__ import annotations

import subprocess
import sys

# Each is imported where it is first needed: a download, an engine, a reply, a GGUF header, the keychain;
# the event loop (asyncio, qasync) and the chat history (SQLite) once the window is painted; the
# single-instance server (QtNetwork) once it listens; the hardware probes (psutil) by the router.
LATER = (
    "httpx",
    "gguf",
    "numpy",
    "markdown_it",
    "pygments",
    "keyring",
    "app.commands.models",
    "asyncio",
    "qasync",
    "sqlite3",
    "PySide6.QtNetwork",
    "psutil",
)


def test_importing_the_window_does_not_import_the_heavy_libraries() -> None:
    probe = f"import sys, app.cli, app.ui.launch; print(' '.join(m for m in {LATER!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []
