"""``lemon-desk serve`` as a real child process for tests: started on a free port, its URL read from the
one line it prints (text, or with ``--json`` an object), stopped with SIGTERM (and checked to exit 0)."""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

URL_LINE = re.compile(r"(http://\S+?)/v1/")


@dataclass
class Serving:
    proc: subprocess.Popen[str]
    url: str  # http://127.0.0.1:PORT, without a prefix
    line: str  # the line serve printed once it listened


def _url(line: str) -> str | None:
    if line.startswith("{"):
        return str(json.loads(line)["url"])
    match = URL_LINE.search(line)
    return match.group(1) if match else None


def _first_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            proc.kill()
            raise AssertionError(f"serve printed nothing in {timeout_s:g} s")
    return proc.stdout.readline()


@contextmanager
def serving(*args: str, env: dict[str, str] | None = None, timeout_s: float = 60.0) -> Iterator[Serving]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        line = _first_line(proc, timeout_s)
        url = _url(line)
        if url is None:
            proc.kill()
            _, err = proc.communicate(timeout=10)
            raise AssertionError(f"serve printed {line!r}; stderr: {err}")
        yield Serving(proc, url, line)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            started = time.monotonic()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise AssertionError(
                    f"serve did not stop within {time.monotonic() - started:.0f} s"
                ) from None
            assert proc.returncode == 0, f"serve exited {proc.returncode} on SIGTERM"
        if proc.stdout:
            proc.stdout.close()
        if proc.stderr:
            proc.stderr.close()
