"""Fixtures for tests that run the real llama-server on the real SmolLM2 GGUF (both cached; see support)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from app.core.hardware import Hardware, hardware_from_json
from app.core.launch import LaunchRequest
from tests.conftest import profile_path
from tests.support.llama import Say, llama_server_dir, smollm_gguf

if sys.platform != "linux":
    pytest.skip("the real-engine tests run llama.cpp's Linux build", allow_module_level=True)


@pytest.fixture(scope="session")
def say(request: pytest.FixtureRequest) -> Say:
    """Print past pytest's capture, so a first run shows what it fetches and builds."""
    capture = request.config.pluginmanager.getplugin("capturemanager")

    def say(line: str) -> None:
        with capture.global_and_fixture_disabled():
            print(f"[test support] {line}", flush=True)

    return say


@pytest.fixture(scope="session")
def llama_dir(say: Say) -> Path:
    return llama_server_dir(say)


@pytest.fixture(scope="session")
def smol_gguf(say: Say) -> Path:
    return smollm_gguf(say)


@pytest.fixture
def cpu_hardware() -> Hardware:
    return hardware_from_json(json.loads(profile_path("cpu_only_x86").read_text()))


@pytest.fixture
def llama_request(llama_dir: Path, smol_gguf: Path) -> LaunchRequest:
    """The real llama-server run straight from the test cache (the installer has its own tests)."""
    return LaunchRequest(
        recipe="llamacpp",
        backend="cpu",
        binary=str(llama_dir / "llama-server"),
        library_dir=str(llama_dir),
        model=str(smol_gguf),
        ctx_size=2048,
    )
