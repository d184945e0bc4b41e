"""A real Secret Service keychain (gnome-keyring) in a private D-Bus session, for tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
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
    # The backend the process had before (chosen now, in its own environment, if not yet chosen).
    previous = keyring.get_keyring()
    saved = {name: os.environ.get(name) for name in ("DBUS_SESSION_BUS_ADDRESS", "PYTHON_KEYRING_BACKEND")}
    os.environ["DBUS_SESSION_BUS_ADDRESS"] = address
    os.environ["PYTHON_KEYRING_BACKEND"] = "keyring.backends.SecretService.Keyring"  # for child processes
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
    _wait_for_unlocked_login_keyring()
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
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _wait_for_unlocked_login_keyring(timeout_s: float = 15.0) -> None:
    """Wait until the daemon started above owns the Secret Service name, and its login keyring is open.

    Asking the Secret Service anything before the name is owned makes D-Bus start a second daemon of
    its own, whose login keyring stays locked ("Failed to unlock the collection"); asking the bus who
    owns the name starts nothing.
    """
    # Linux-only packages (keyring's Secret Service dependencies), like the daemon itself.
    import secretstorage
    from jeepney import DBusAddress, new_method_call
    from jeepney.io.blocking import open_dbus_connection

    deadline = time.monotonic() + timeout_s
    bus = DBusAddress(
        "/org/freedesktop/DBus", bus_name="org.freedesktop.DBus", interface="org.freedesktop.DBus"
    )
    with open_dbus_connection(bus="SESSION") as connection:
        has_owner = new_method_call(bus, "NameHasOwner", "s", ("org.freedesktop.secrets",))
        while not connection.send_and_get_reply(has_owner).body[0]:
            if time.monotonic() > deadline:
                raise RuntimeError("gnome-keyring-daemon did not take the Secret Service name")
            time.sleep(0.02)
        while secretstorage.Collection(connection).is_locked():
            if time.monotonic() > deadline:
                raise RuntimeError("gnome-keyring-daemon did not unlock its login keyring")
            time.sleep(0.02)
