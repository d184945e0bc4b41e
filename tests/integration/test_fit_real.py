"""The fit estimate against reality: SmolLM2-135M's footprint in a real llama-server, read from its RSS."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from gguf import GGUFReader

from app.cli import main
from app.store.model_paths import local_gguf_metadata
from tests.conftest import profile_path
from tests.support.hubserver import HubRepo, LoopbackHub
from tests.support.testrepos import loopback_hub

pytestmark = pytest.mark.integration
REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
CONTEXTS = (2048, 8192)


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smol_gguf: Path) -> Iterator[LoopbackHub]:
    with loopback_hub(tmp_path / "hf-cache", monkeypatch) as running:
        running.add(HubRepo(REPO, {"SmolLM2-135M-Instruct.Q4_1.gguf": smol_gguf.read_bytes()}))
        yield running


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def loaded_rss(llama_dir: Path, model: Path, context: int) -> int:
    """Start llama-server on ``model`` at ``context`` tokens, wait until it serves, read its RSS, stop it."""
    port = free_port()
    proc = subprocess.Popen(
        [
            str(llama_dir / "llama-server"),
            "-m",
            str(model),
            "-c",
            str(context),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env={**os.environ, "LD_LIBRARY_PATH": str(llama_dir)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"llama-server exited with {proc.returncode}"
            assert time.monotonic() < deadline, "llama-server did not become ready"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        return int(psutil.Process(proc.pid).memory_info().rss)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_fit_estimate_is_within_a_quarter_of_the_real_footprint(
    hub: LoopbackHub,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    llama_dir: Path,
    smol_gguf: Path,
) -> None:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))
    for context in CONTEXTS:
        # The estimate the user sees before downloading: Range reads of the header through the Hub.
        assert main(["pull", f"{REPO}:Q4_1", "--dry-run", "--json", "--ctx-size", str(context)]) == 0
        fit = json.loads(capsys.readouterr().out)["fit"]
        assert fit["verdict"] == "fits"
        rss = loaded_rss(llama_dir, smol_gguf, context)
        error = (fit["need_bytes"] - rss) / rss
        figures = f"ctx {context}: estimate {fit['need_bytes'] / 2**20:.0f} MiB, RSS {rss / 2**20:.0f} MiB"
        assert abs(error) <= 0.25, f"{figures}, {error:+.1%}"
    assert all("/resolve/" not in p or (r and not r.endswith("-")) for p, r in hub.served.log)


def test_metadata_walk_agrees_with_the_gguf_reader_on_a_real_model(smol_gguf: Path) -> None:
    mine = local_gguf_metadata(smol_gguf)
    theirs = GGUFReader(smol_gguf)
    compared = 0
    for key, field in theirs.fields.items():
        if key.startswith(("GGUF.", "tokenizer.")):
            continue
        expected = field.contents()
        assert mine[key] == (pytest.approx(expected) if isinstance(expected, float) else expected), key
        compared += 1
    assert compared >= 15 and mine["llama.block_count"] == 30
