"""Download speed from a loopback server: the app's downloader against curl, same file, same session.

    .venv/bin/python tests/bench/download.py [--mib 512] [--rounds 5]

The server runs in its own process (so it does not share the app's interpreter), serving random bytes
from memory. Each round runs curl and the app, in turns going first, each after a sync (so neither
pays for the other's dirty pages) and into a fresh file on the same disk. The app's
run is ``app.supervisor.fetch.fetch`` as model and engine downloads use it: into ``<dest>.part``, SHA-256
verified, renamed. Prints each round and the ratio of the medians (target: >= 0.9).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.supervisor.fetch import fetch  # noqa: E402

SERVER = """
import os, sys, time
sys.path.insert(0, {root!r})
from tests.support.fileserver import Served, serve
body = os.urandom({size})
with serve(Served(files={{"/file.bin": body}})) as base:
    print(base, flush=True)
    sys.stdin.read()  # until the bench closes our stdin
"""


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mib", type=int, default=512, help="file size in MiB (default 512)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of curl + app (default 5)")
    args = parser.parse_args()
    if shutil.which("curl") is None:
        print("curl is not installed", file=sys.stderr)
        return 1
    size = args.mib << 20
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER.format(root=str(ROOT), size=size)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None and server.stdin is not None
    url = server.stdout.readline().strip() + "/file.bin"
    try:
        with tempfile.TemporaryDirectory(dir=ROOT) as tmp, httpx.Client() as client:
            folder = Path(tmp)
            expected = fetch_once(client, url, folder / "reference.bin", None)
            (folder / "reference.bin").unlink()
            curl_s, app_s = [], []
            for n in range(1, args.rounds + 1):
                runs = [
                    (curl_s, lambda: curl(url, folder / "curl.bin")),
                    (app_s, lambda: fetch_once(client, url, folder / "app.bin", expected)),
                ]
                for times, run in runs if n % 2 else reversed(runs):  # neither always goes first
                    os.sync()  # start each run with no dirty pages left by the one before
                    times.append(timed(run))
                for name in ("curl.bin", "app.bin"):
                    (folder / name).unlink()
                speeds = f"curl {args.mib / curl_s[-1]:7.0f} MiB/s   app {args.mib / app_s[-1]:7.0f} MiB/s"
                print(f"round {n}: {speeds}")
    finally:
        server.stdin.close()
        server.wait(timeout=30)
    curl_speed = args.mib / statistics.median(curl_s)
    app_speed = args.mib / statistics.median(app_s)
    print(f"file: {args.mib} MiB over loopback, {args.rounds} rounds, medians")
    print(f"curl: {curl_speed:.0f} MiB/s")
    print(f"app : {app_speed:.0f} MiB/s (SHA-256 verified)")
    print(f"ratio app/curl: {app_speed / curl_speed:.2f} (target >= 0.9)")
    return 0


def timed(run: object) -> float:
    start = time.perf_counter()
    run()  # type: ignore[operator]
    return time.perf_counter() - start


def curl(url: str, dest: Path) -> None:
    subprocess.run(["curl", "--silent", "--fail", "--output", str(dest), url], check=True)


def fetch_once(client: httpx.Client, url: str, dest: Path, sha256: str | None) -> str:
    digest = asyncio.run(fetch(client, url, dest, sha256=sha256))
    if sha256 is None:
        assert digest == hashlib.sha256(dest.read_bytes()).hexdigest()
    return digest


if __name__ == "__main__":
    raise SystemExit(main())
