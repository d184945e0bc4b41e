"""A bare paced TCP relay, for the benches' floor: what passing a stream on at one wake a frame costs on
this machine, with nothing else done.

    python -m tests.support.paced_relay HOST PORT

Listens on a free loopback port, prints it, and relays each connection to HOST:PORT byte for byte: the
client's bytes as they come, the engine's as they come for the first two reads (an answer's head, then
its first token) and then one read a frame (``FRAME_S``), as the API's splice reads them (``SO_RCVLOWAT``
high, ``SO_RCVTIMEO`` the frame: one wake of the thread a frame, the engine's close read at once), each
read written on in one write. No HTTP, no events, no figures: a relay can cost no less per frame, so its
CPU time per token is the floor under any relay paced the same way in Python. Runs until its standard
input closes.

``native_relay`` builds its twin in C (``paced_relay.c``): the floor under a relay that runs no interpreter,
the kernel's share and the thread's.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import socket
import struct
import sys
import threading
from pathlib import Path

from app.client.pacing import FRAME_S
from app.client.splice import HELD_BYTES, READ_BYTES
from tests.support.llama import Say, cache_dir, made_once, run_logged

NATIVE_SOURCE = Path(__file__).with_name("paced_relay.c")


def _upstream(client: socket.socket, engine: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := client.recv(READ_BYTES):
            engine.sendall(data)


def _relay(client: socket.socket, address: tuple[str, int]) -> None:
    engine: socket.socket | None = None
    reads = 0
    try:
        engine = socket.create_connection(address)
        engine.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_upstream, args=(client, engine), daemon=True).start()
        while True:
            if reads == 2:
                engine.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, HELD_BYTES)
                engine.setsockopt(
                    socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, int(FRAME_S * 1e6))
                )
            try:
                data = engine.recv(READ_BYTES)
            except BlockingIOError:
                continue  # a frame without a byte
            if not data:
                break
            reads += 1
            client.sendall(data)
    except OSError:
        pass
    finally:
        if engine is not None:
            engine.close()
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_RDWR)
        client.close()


def main() -> None:
    address = (sys.argv[1], int(sys.argv[2]))
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)

    def accept() -> None:
        while True:
            client, _ = listener.accept()
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=_relay, args=(client, address), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    sys.stdin.read()  # until the parent closes the pipe


def native_relay(say: Say) -> Path | None:
    """The C relay, compiled once per version of its source into the tests' cache; None where there is no
    C compiler."""
    compiler = shutil.which("cc")
    if compiler is None:
        return None
    source = NATIVE_SOURCE.read_bytes()
    target = cache_dir() / f"paced-relay-{hashlib.sha256(source).hexdigest()[:12]}"

    def build(path: Path) -> None:
        argv = [compiler, "-O2", "-pthread", "-o", str(path), str(NATIVE_SOURCE)]
        run_logged(argv, cache_dir() / "set-up.log", say)
        path.chmod(0o755)

    return made_once(target, "paced-relay", build, say, "building the native paced relay")


def native_argv(binary: Path, host: str, port: int) -> list[str]:
    """How to run the C relay to ``host:port`` at the app's frame and read sizes (it takes no Python
    constants)."""
    return [str(binary), host, str(port), str(round(FRAME_S * 1e6)), str(READ_BYTES), str(HELD_BYTES)]


if __name__ == "__main__":
    main()
