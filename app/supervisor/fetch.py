"""Resumable HTTP downloads: the one way the app fetches engines and models.

A download streams into ``<dest>.part`` (a stable name, so a new process resumes it after a crash),
asks for the rest with a Range request, retries resets, 5xx and stalls with backoff, verifies SHA-256,
and only then renames the file into place. Cancelling keeps the partial file: that is "pause".
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from app.core.errors import DownloadError

CHUNK = 1 << 20
PROGRESS_INTERVAL_S = 0.1
SPEED_WINDOW_S = 3.0
RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Progress:
    done: int  # bytes on disk, resumed bytes included
    total: int | None  # None while the server has not said
    speed_bps: float  # over the last few seconds
    eta_s: float | None

    @property
    def fraction(self) -> float | None:
        return self.done / self.total if self.total else None


ProgressCallback = Callable[[Progress], None]


def partial_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


class _Meter:
    """Speed over a sliding window, and throttled progress reports."""

    def __init__(self, on_progress: ProgressCallback | None) -> None:
        self.on_progress = on_progress
        self.samples: list[tuple[float, int]] = []
        self.last_report = 0.0

    def update(self, done: int, total: int | None, force: bool = False) -> None:
        now = time.monotonic()
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[0][0] > SPEED_WINDOW_S:
            self.samples.pop(0)
        if self.on_progress is None or (not force and now - self.last_report < PROGRESS_INTERVAL_S):
            return
        self.last_report = now
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        speed = (d1 - d0) / (t1 - t0) if t1 > t0 else 0.0
        eta = (total - done) / speed if total and speed > 0 else None
        self.on_progress(Progress(done, total, speed, eta))


def _total_from(response: httpx.Response, offset: int) -> int | None:
    if response.status_code in (206, 416):
        content_range = response.headers.get("content-range", "")
        total = content_range.rpartition("/")[2]
        return int(total) if total.isdigit() else None
    length = response.headers.get("content-length")
    return int(length) + offset if length and length.isdigit() else None


@dataclass
class _State:
    """What is on disk so far: the partial file's length and the running digest of its bytes."""

    hasher: hashlib._Hash
    offset: int
    total: int | None = None

    @classmethod
    def resume(cls, part: Path) -> _State:
        hasher = hashlib.sha256()
        offset = 0
        if part.exists():
            with part.open("rb") as f:
                while block := f.read(CHUNK * 4):
                    hasher.update(block)
                    offset += len(block)
        return cls(hasher, offset)

    def restart(self) -> None:
        self.hasher, self.offset = hashlib.sha256(), 0


async def fetch(
    client: httpx.AsyncClient,
    url: str,
    dest: Path,
    *,
    sha256: str | None = None,
    headers: dict[str, str] | None = None,
    on_progress: ProgressCallback | None = None,
    retries: int = 5,
    stall_timeout_s: float = 30.0,
    backoff_s: float = 0.5,
) -> str:
    """Download ``url`` to ``dest``; returns the SHA-256 hex digest of what was written.

    ``retries`` counts consecutive attempts that made no progress, so a connection that keeps
    breaking but moves forward each time still finishes.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = partial_path(dest)
    meter = _Meter(on_progress)
    state = _State.resume(part)
    failures = 0
    while True:
        before = state.offset
        try:
            await _attempt(client, url, part, state, headers, meter, stall_timeout_s)
            break
        except _Retryable as err:
            failures = 0 if state.offset > before else failures + 1
            if failures > retries:
                raise DownloadError(
                    f"Download of {url} failed after {retries} retries: {err}.",
                    "Check the connection and try again; the download will resume where it stopped.",
                ) from None
            await asyncio.sleep(min(backoff_s * 2 ** max(failures - 1, 0), 30.0))
    meter.update(state.offset, state.total, force=True)
    digest = state.hasher.hexdigest()
    if sha256 and digest != sha256.lower():
        part.unlink(missing_ok=True)
        raise DownloadError(
            f"{dest.name} is corrupt: its SHA-256 is {digest}, expected {sha256.lower()}.",
            "The damaged file was deleted; try again.",
        )
    os.replace(part, dest)
    return digest


class _Retryable(Exception):
    """A failure worth another attempt: a reset, a stall, a 5xx."""


async def _attempt(
    client: httpx.AsyncClient,
    url: str,
    part: Path,
    state: _State,
    headers: dict[str, str] | None,
    meter: _Meter,
    stall_timeout_s: float,
) -> None:
    request_headers = dict(headers or {})
    if state.offset:
        request_headers["Range"] = f"bytes={state.offset}-"
    timeout = httpx.Timeout(stall_timeout_s, connect=min(stall_timeout_s, 15.0))
    try:
        async with client.stream(
            "GET", url, headers=request_headers, timeout=timeout, follow_redirects=True
        ) as response:
            if response.status_code == 416 and state.offset:
                if _total_from(response, 0) == state.offset:
                    state.total = state.offset  # already whole: the last run stopped before the rename
                    return
                # The partial file is no prefix of what the server has: start over.
                part.unlink(missing_ok=True)
                state.restart()
                raise _Retryable("the server refused to resume; starting over")
            if response.status_code in RETRYABLE_STATUS:
                raise _Retryable(f"HTTP {response.status_code}")
            if response.status_code >= 400:
                raise DownloadError(
                    f"Download of {url} failed: HTTP {response.status_code}.", status=response.status_code
                )
            if state.offset and response.status_code != 206:
                state.restart()  # the server ignored Range: take the whole file
            state.total = _total_from(response, state.offset)
            with part.open("r+b" if state.offset else "wb") as f:
                f.seek(state.offset)
                f.truncate()
                async for chunk in response.aiter_raw(CHUNK):
                    f.write(chunk)
                    state.hasher.update(chunk)
                    state.offset += len(chunk)
                    meter.update(state.offset, state.total)
    except httpx.TransportError as err:
        raise _Retryable(type(err).__name__) from None
    if state.total is not None and state.offset < state.total:
        raise _Retryable(f"the connection closed at {state.offset} of {state.total} bytes")
