"""A real Secret Service keychain (gnome-keyring) in a private D-Bus session, for tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import keyring
from keyring.backends import SecretService

MISSING = (
    "gnome-keyring-daemon is not installed: run the README's test command (tests/run), which installs it."
)


@contextmanager
def private_keychain(data_dir: Path) -> Iterator[None]:
    """Starts dbus-daemon and gnome-keyring-daemon (keyrings under ``data_dir``), stops both after."""
    if shutil.which("gnome-keyring-daemon") is None:
        raise RuntimeError(MISSING)
    bus = subprocess.Popen(
        ["dbus-daemon", "--session", "--nofork", "--print-address=1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert bus.stdout is not None
    address = bus.stdout.readline().strip()
    saved = os.environ.get("DBUS_SESSION_BUS_ADDRESS")
    os.environ["DBUS_SESSION_BUS_ADDRESS"] = address
    keyring_daemon = subprocess.run(
        ["gnome-keyring-daemon", "--unlock", "--components=secrets"],
        input="test-password",
        env={**os.environ, "XDG_DATA_HOME": str(data_dir), "XDG_RUNTIME_DIR": str(data_dir)},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    daemon_pid = next(
        (
            int(line.split("=", 1)[1])
            for line in keyring_daemon.stdout.splitlines()
            if line.startswith("GNOME_KEYRING_PID=")
        ),
        None,
    )
    previous = keyring.get_keyring()
    keyring.set_keyring(SecretService.Keyring())
    try:
        yield
    finally:
        keyring.set_keyring(previous)
        if daemon_pid:
            with suppress(ProcessLookupError):
                os.kill(daemon_pid, 15)
        bus.terminate()
        bus.wait(timeout=10)
        bus.stdout.close()
        if saved is None:
            os.environ.pop("DBUS_SESSION_BUS_ADDRESS", None)
        else:
            os.environ["DBUS_SESSION_BUS_ADDRESS"] = saved
