"""Resumable downloads against a real loopback server that cuts, stalls, corrupts and errors."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import httpx
import pytest

from app.core.errors import DownloadError
from app.supervisor.fetch import CHUNK, Progress, fetch, partial_path
from tests.support.fileserver import Fault, Served, serve

BODY = os.urandom(3 * CHUNK + 12345)
DIGEST = hashlib.sha256(BODY).hexdigest()


def download(url: str, dest: Path, **kw: object) -> str:
    async def go() -> str:
        with httpx.Client() as client:
            return await fetch(client, url, dest, backoff_s=0.01, **kw)  # type: ignore[arg-type]

    return asyncio.run(go())


@pytest.fixture
def served() -> Served:
    return Served(files={"/f.bin": BODY})


def test_whole_download_with_progress(served: Served, tmp_path: Path) -> None:
    seen: list[Progress] = []
    with serve(served) as base:
        digest = download(f"{base}/f.bin", tmp_path / "f.bin", sha256=DIGEST, on_progress=seen.append)
    assert digest == DIGEST
    assert (tmp_path / "f.bin").read_bytes() == BODY
    assert not partial_path(tmp_path / "f.bin").exists()
    assert seen[-1].done == len(BODY) and seen[-1].total == len(BODY)
    assert [p.done for p in seen] == sorted(p.done for p in seen)


def test_cut_connection_resumes_from_where_it_stopped(served: Served, tmp_path: Path) -> None:
    served.arm("/f.bin", Fault(cut_after=CHUNK + 100))
    with serve(served) as base:
        digest = download(f"{base}/f.bin", tmp_path / "f.bin", sha256=DIGEST)
    assert digest == DIGEST
    ranges = served.bytes_sent("/f.bin")
    assert len(ranges) == 2 and ranges[0] is None
    resumed_at = int(ranges[1].removeprefix("bytes=").rstrip("-"))  # type: ignore[union-attr]
    assert CHUNK <= resumed_at <= CHUNK + 100


def test_partial_file_from_an_earlier_run_is_resumed(served: Served, tmp_path: Path) -> None:
    dest = tmp_path / "f.bin"
    partial_path(dest).write_bytes(BODY[: 2 * CHUNK])
    with serve(served) as base:
        assert download(f"{base}/f.bin", dest, sha256=DIGEST) == DIGEST
    assert served.bytes_sent("/f.bin") == [f"bytes={2 * CHUNK}-"]


def test_complete_partial_file_is_finished_without_refetching(served: Served, tmp_path: Path) -> None:
    dest = tmp_path / "f.bin"
    partial_path(dest).write_bytes(BODY)
    with serve(served) as base:
        assert download(f"{base}/f.bin", dest, sha256=DIGEST) == DIGEST
    assert dest.read_bytes() == BODY


def test_wrong_bytes_are_caught_and_deleted(served: Served, tmp_path: Path) -> None:
    served.arm("/f.bin", Fault(corrupt=True))
    with serve(served) as base, pytest.raises(DownloadError, match="corrupt"):
        download(f"{base}/f.bin", tmp_path / "f.bin", sha256=DIGEST)
    assert not (tmp_path / "f.bin").exists()
    assert not partial_path(tmp_path / "f.bin").exists()


def test_server_errors_and_stalls_are_retried(served: Served, tmp_path: Path) -> None:
    served.arm("/f.bin", Fault(status=503))
    served.arm("/f.bin", Fault(stall_s=6.0))
    # A stall three times the timeout; the timeout long enough that the clean request is never taken
    # for a stall on a busy machine (which would make a fourth request).
    with serve(served) as base:
        assert download(f"{base}/f.bin", tmp_path / "f.bin", sha256=DIGEST, stall_timeout_s=2.0) == DIGEST
    assert len(served.bytes_sent("/f.bin")) == 3


def test_missing_file_fails_at_once_with_its_status(served: Served, tmp_path: Path) -> None:
    with serve(served) as base, pytest.raises(DownloadError) as err:
        download(f"{base}/nope.bin", tmp_path / "nope.bin")
    assert err.value.status == 404
    assert len(served.bytes_sent("/nope.bin")) == 1


def test_endless_failure_gives_up_with_a_clear_error(served: Served, tmp_path: Path) -> None:
    for _ in range(10):
        served.arm("/f.bin", Fault(status=502))
    with serve(served) as base, pytest.raises(DownloadError, match="after 2 retries"):
        download(f"{base}/f.bin", tmp_path / "f.bin", retries=2)
    assert len(served.bytes_sent("/f.bin")) == 3


def test_server_that_ignores_range_still_gives_the_right_file(served: Served, tmp_path: Path) -> None:
    dest = tmp_path / "f.bin"
    partial_path(dest).write_bytes(BODY[:CHUNK])
    served.arm("/f.bin", Fault(ignore_range=True))
    with serve(served) as base:
        assert download(f"{base}/f.bin", dest, sha256=DIGEST) == DIGEST


def test_cancel_keeps_the_partial_file_for_resume(served: Served, tmp_path: Path) -> None:
    dest = tmp_path / "f.bin"
    served.arm("/f.bin", Fault(cut_after=2 * CHUNK, stall_s=0))

    async def go(base: str) -> None:
        started = asyncio.Event()

        def on_progress(p: Progress) -> None:
            if p.done >= CHUNK:
                started.set()

        with httpx.Client() as client:
            task = asyncio.create_task(fetch(client, f"{base}/f.bin", dest, on_progress=on_progress))
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    with serve(served) as base:
        asyncio.run(go(base))
        assert not dest.exists()
        kept = partial_path(dest).stat().st_size
        assert kept >= CHUNK
        assert download(f"{base}/f.bin", dest, sha256=DIGEST) == DIGEST
    assert served.bytes_sent("/f.bin")[-1] == f"bytes={kept}-"


def test_a_body_without_a_length_is_read_to_the_end(served: Served, tmp_path: Path) -> None:
    served.arm("/f.bin", Fault(no_length=True))
    with serve(served) as base:
        assert download(f"{base}/f.bin", tmp_path / "f.bin", sha256=DIGEST) == DIGEST
    assert served.bytes_sent("/f.bin") == [None]


def test_a_redirect_loop_fails_at_once_with_its_name(served: Served, tmp_path: Path) -> None:
    """A server that redirects a file to itself: the app's own error, not httpx's, and no retries."""
    for _ in range(30):
        served.arm("/f.bin", Fault(status=302))
    served.headers["/f.bin"] = {"Location": "/f.bin"}
    with (
        serve(served) as base,
        pytest.raises(DownloadError, match=r"redirects it in a loop \(TooManyRedirects\)"),
    ):
        download(f"{base}/f.bin", tmp_path / "f.bin")
    assert len(served.bytes_sent("/f.bin")) == 21  # httpx's first request and its 20 redirects, once


def test_a_content_range_total_in_other_digits_is_an_unknown_total(tmp_path: Path) -> None:
    """``bytes 0-4/²``: str.isdigit() takes "²", which int() refuses; the size is unknown, not a crash."""

    def answer(request: httpx.Request) -> httpx.Response:
        # A stream, not content=: the body is read the way a server's is, not already in memory.
        headers = [(b"Content-Range", b"bytes 0-4/\xb2")]
        return httpx.Response(206, stream=httpx.ByteStream(b"hello"), headers=headers)

    seen: list[Progress] = []

    async def go() -> str:
        with httpx.Client(transport=httpx.MockTransport(answer)) as client:
            return await fetch(client, "http://files/f.bin", tmp_path / "f.bin", on_progress=seen.append)

    assert asyncio.run(go()) == hashlib.sha256(b"hello").hexdigest()
    assert (tmp_path / "f.bin").read_bytes() == b"hello" and seen[-1].total is None


REDIRECT_BODY = 64 << 20


def test_a_redirect_is_followed_without_its_body_being_read(served: Served, tmp_path: Path) -> None:
    """A server (a mirror, a proxy) whose redirect has a body without end (64 MiB here): the download
    follows it at once and leaves that body unread; httpx read it whole before following."""
    served.files["/cdn/f.bin"] = BODY
    served.headers["/f.bin"] = {"Location": "/cdn/f.bin"}
    served.arm("/f.bin", Fault(status=302, status_body=REDIRECT_BODY))
    with serve(served) as base:
        assert download(f"{base}/f.bin", tmp_path / "f.bin", sha256=DIGEST) == DIGEST
    ((_, _, sent, _),) = [record for record in served.sent if record[0] == "/f.bin"]
    assert isinstance(sent, int) and sent < REDIRECT_BODY // 8, sent


def test_a_redirect_to_another_host_does_not_carry_the_authorization(served: Served, tmp_path: Path) -> None:
    """A file the Hub sends on to a CDN: the HF token goes to the Hub only."""
    elsewhere = Served(files={"/cdn/f.bin": BODY})
    with serve(elsewhere) as cdn, serve(served) as base:
        served.headers["/f.bin"] = {"Location": f"{cdn}/cdn/f.bin"}
        served.arm("/f.bin", Fault(status=302))
        token = {"Authorization": "Bearer hf_secret"}
        assert download(f"{base}/f.bin", tmp_path / "f.bin", sha256=DIGEST, headers=token) == DIGEST
    assert served.authorizations == ["Bearer hf_secret"] and elsewhere.authorizations == [None]
