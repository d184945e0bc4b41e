"""One app per user and home folder: a second launch asks the first to show its window, then exits.

The first instance listens on a local socket in the user's runtime folder, named after its
``LEMON_DESK_HOME`` so that separate homes (tests, several profiles) do not meet. A lock file makes the
check-then-listen step safe when two launches race.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path

import platformdirs
from PySide6.QtCore import QLockFile, QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

from app.store.paths import APP_NAME, home

SHOW = b"show\n"
CONNECT_TIMEOUT_MS = 1000
LOCK_TIMEOUT_MS = 5000


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
        self._server = QLocalServer(self)
        self._server.newConnection.connect(self._accept)
        self._clients: list[QLocalSocket] = []

    def claim(self) -> bool:
        """True if this is the first instance (it now listens); False if another one was told to show."""
        lock = QLockFile(str(self.path.with_suffix(".lock")))
        if not lock.tryLock(LOCK_TIMEOUT_MS):
            return not self._ask_to_show()
        try:
            if self._ask_to_show():
                return False
            QLocalServer.removeServer(str(self.path))  # a socket left by an instance that died
            self._server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
            if not self._server.listen(str(self.path)):
                raise OSError(f"cannot listen on {self.path}: {self._server.errorString()}")
            return True
        finally:
            lock.unlock()

    def close(self) -> None:
        self._server.close()

    def _ask_to_show(self) -> bool:
        socket = QLocalSocket()
        socket.connectToServer(str(self.path))
        if not socket.waitForConnected(CONNECT_TIMEOUT_MS):
            return False
        socket.write(SHOW)
        socket.waitForBytesWritten(CONNECT_TIMEOUT_MS)
        socket.disconnectFromServer()
        if socket.state() != QLocalSocket.LocalSocketState.UnconnectedState:
            socket.waitForDisconnected(CONNECT_TIMEOUT_MS)
        return True

    def _accept(self) -> None:
        while (socket := self._server.nextPendingConnection()) is not None:
            self._clients.append(socket)
            # Slots are methods that find their socket with sender(): a lambda holding the socket would be
            # released while Qt destroys it, which crashes PySide.
            socket.readyRead.connect(self._read)
            socket.disconnected.connect(self._drop)

    def _read(self) -> None:
        socket = self.sender()
        if isinstance(socket, QLocalSocket) and SHOW.strip() in bytes(socket.readAll().data()):
            self.activation_requested.emit()

    def _drop(self) -> None:
        socket = self.sender()
        if isinstance(socket, QLocalSocket) and socket in self._clients:
            self._clients.remove(socket)
            socket.deleteLater()
