"""One app per user and home folder: a second launch asks the first to show its window, then exits.

The first instance listens on a local socket in the user's runtime folder, named after its
``LEMON_DESK_HOME`` so that separate homes (tests, several profiles) do not meet. A lock on a file beside
the socket makes the check-then-listen step safe when two launches race: ``claim()`` takes it and checks,
``listen()`` (once the window shows) listens and lets it go, so a launch in between waits for the lock
and then finds the socket. The kernel drops the lock of a process that dies.

The check and the request to show are plain Unix-socket calls, and QtNetwork (``QLocalServer``) is
imported only by ``listen()``: neither costs the window's first paint anything. ``fcntl.flock`` rather
than ``QLockFile``, which syncs its file to disk on every lock (milliseconds on a busy disk).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import platformdirs
from PySide6.QtCore import QObject, Signal

from app.store.paths import APP_NAME, home

if TYPE_CHECKING:
    from PySide6.QtNetwork import QLocalServer, QLocalSocket

SHOW = b"show\n"
CONNECT_TIMEOUT_S = 1.0
LOCK_TIMEOUT_S = 5.0
LOCK_POLL_S = 0.02


def runtime_dir() -> Path:
    """The user's runtime folder (XDG_RUNTIME_DIR on Linux), else a private folder under the temp dir."""
    candidates = [Path(tempfile.gettempdir()) / f"{APP_NAME}-{os.getuid()}"]
    if sys.platform == "darwin" or os.environ.get("XDG_RUNTIME_DIR"):
        # Without XDG_RUNTIME_DIR platformdirs warns on stderr and guesses; the private folder serves.
        candidates.insert(0, Path(platformdirs.user_runtime_dir(APP_NAME)))
    for candidate in candidates:
        try:
            candidate.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(candidate, os.W_OK):
            return candidate
    raise OSError("no writable runtime folder")


def socket_path() -> Path:
    digest = hashlib.sha256(str(home().resolve()).encode()).hexdigest()[:16]
    return runtime_dir() / f"instance-{digest}.sock"


class SingleInstance(QObject):
    activation_requested = Signal()  # another launch asked this one to show itself

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.path = socket_path()
        self._lock: int | None = None  # the lock file's descriptor while this process holds the lock
        self._server: QLocalServer | None = None
        self._clients: list[QLocalSocket] = []

    def claim(self) -> bool:
        """True if this is the first instance: it holds the lock until ``listen()``. False if another one
        was told to show."""
        if not self._take_lock():
            return not self._ask_to_show()
        if self._ask_to_show():
            self._release_lock()
            return False
        return True

    def listen(self) -> None:
        """Serve the next launches, if ``claim()`` took the lock (it lets it go either way). Without the
        lock another instance may be listening: its socket is left alone."""
        from PySide6.QtNetwork import QLocalServer

        if self._lock is None:
            return
        try:
            QLocalServer.removeServer(str(self.path))  # a socket left by an instance that died
            server = QLocalServer(self)
            server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
            server.newConnection.connect(self._accept)
            if not server.listen(str(self.path)):
                raise OSError(f"cannot listen on {self.path}: {server.errorString()}")
            self._server = server
        finally:
            self._release_lock()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self._release_lock()

    def _take_lock(self) -> bool:
        fd = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(LOCK_POLL_S)
                    continue
                os.close(fd)
                return False
            self._lock = fd
            return True

    def _release_lock(self) -> None:
        # The file stays: removing it would let a launch lock a new file while another waits on this one.
        if self._lock is not None:
            os.close(self._lock)  # closing the descriptor releases the lock
            self._lock = None

    def _ask_to_show(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(CONNECT_TIMEOUT_S)
            try:
                client.connect(str(self.path))
            except OSError:  # no socket, or one left by an instance that died
                return False
            try:
                client.sendall(SHOW)
            except OSError:  # it went away meanwhile
                return False
        return True

    def _accept(self) -> None:
        assert self._server is not None
        while (peer := self._server.nextPendingConnection()) is not None:
            self._clients.append(peer)
            # Slots are methods that find their socket with sender(): a lambda holding the socket would be
            # released while Qt destroys it, which crashes PySide.
            peer.readyRead.connect(self._read)
            peer.disconnected.connect(self._drop)

    def _read(self) -> None:
        from PySide6.QtNetwork import QLocalSocket

        peer = self.sender()
        if isinstance(peer, QLocalSocket) and SHOW.strip() in bytes(peer.readAll().data()):
            self.activation_requested.emit()

    def _drop(self) -> None:
        from PySide6.QtNetwork import QLocalSocket

        peer = self.sender()
        if isinstance(peer, QLocalSocket) and peer in self._clients:
            self._clients.remove(peer)
            peer.deleteLater()
