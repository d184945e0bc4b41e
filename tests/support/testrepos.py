"""The model repos most tests download from the loopback Hub, built once per test session."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import pytest

from tests.support.hubserver import HubRepo, LoopbackHub
from tests.support.modelfiles import gguf_files, mlx_files

BIG = "test-org/Big-GGUF"  # a sharded Q4_K_M in a folder, a single-file Q8_0, a vision projector
TINY_MLX = "mlx-test/Tiny-4bit"  # an MLX repo with two weight shards and an index
SHARDS = [f"Q4_K_M/Big-Q4_K_M-0000{i}-of-00003.gguf" for i in (1, 2, 3)]


@cache
def big_files() -> dict[str, bytes]:
    files = {f"Q4_K_M/{name}": data for name, data in gguf_files("Big-Q4_K_M", layers=6, shards=3).items()}
    files["Big-Q8_0.gguf"] = gguf_files("Big-Q8_0", layers=3)["Big-Q8_0.gguf"]
    files["mmproj-Big-f16.gguf"] = gguf_files("mmproj-Big-f16", layers=1, tensor_kib=64)[
        "mmproj-Big-f16.gguf"
    ]
    files["README.md"] = b"# Big\n"
    return files


@cache
def tiny_mlx_files() -> dict[str, bytes]:
    return mlx_files()


def add_standard_repos(hub: LoopbackHub) -> None:
    hub.add(HubRepo(BIG, dict(big_files()), tags=("gguf",), downloads=50, likes=5))
    hub.add(HubRepo(TINY_MLX, dict(tiny_mlx_files()), tags=("mlx",), downloads=20, likes=1))


@contextmanager
def loopback_hub(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopbackHub]:
    """The standard repos on a running loopback Hub, with HF_ENDPOINT and HF_HUB_CACHE pointing at it."""
    hub = LoopbackHub()
    add_standard_repos(hub)
    with hub.running() as base:
        monkeypatch.setenv("HF_ENDPOINT", base)
        monkeypatch.setenv("HF_HUB_CACHE", str(cache_dir))
        for var in ("HF_HOME", "HF_TOKEN"):
            monkeypatch.delenv(var, raising=False)
        yield hub
