"""The packaged app (``packaging/build.py``'s PyInstaller bundle) as a user runs it: the window, the
command on the real llama-server, the mlx-lm backend installed from the bundle (uv, no ``python -m
venv``) answering with a tiny real MLX model, and the desktop entry. The bundle is built once per source
hash and cached (tests/support/bundle.py); nothing it starts outlives a test."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from app.store.installs import install_dir
from app.supervisor.installer import installed_binary
from tests.integration.conftest import Mirror
from tests.support.bundle import bundle_dir
from tests.support.mlx_env import tiny_mlx_model

pytestmark = pytest.mark.integration

FRANCE = "What is the capital of France? Answer in one word."
READY_TIMEOUT_S = 120


@pytest.fixture(scope="session")
def bundle() -> Path:
    return bundle_dir()


def bundled(bundle: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """The bundle's executable, in a child process, with this test's environment."""
    return subprocess.run(
        [str(bundle / "lemon-desk"), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def processes_under(*roots: Path) -> list[psutil.Process]:
    """Live processes whose executable or command line names one of ``roots``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["status"] != psutil.STATUS_ZOMBIE and any(str(root) in cmdline for root in roots):
            found.append(proc)
    return found


@pytest.fixture
def no_orphans(bundle: Path, lemon_home: Path) -> Iterator[None]:
    yield
    left = processes_under(bundle, lemon_home)
    for proc in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    assert left == [], f"left running: {[p.info['cmdline'] for p in left]}"


def test_the_bundle_answers_help_exactly_as_the_pip_installed_command(bundle: Path) -> None:
    frozen = bundled(bundle, "--help")
    source = subprocess.run(
        [sys.executable, "-m", "app", "--help"], capture_output=True, text=True, check=False
    )
    assert frozen.returncode == source.returncode == 0, frozen.stderr
    assert frozen.stdout == source.stdout
    assert bundled(bundle, "--version").stdout.strip().startswith("lemon-desk ")


def test_the_archive_holds_the_bundle_and_an_install_note(bundle: Path) -> None:
    (archive,) = bundle.parent.glob("lemon-desk-*-linux-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {"lemon-desk/lemon-desk", "lemon-desk/INSTALL.txt"} <= names
    assert "--install-desktop-entry" in (bundle / "INSTALL.txt").read_text()


def test_the_bundle_opens_its_window(bundle: Path, lemon_home: Path, no_orphans: None) -> None:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "LEMON_DESK_PRINT_READY": "1"}
    proc = subprocess.Popen(
        [str(bundle / "lemon-desk")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the ready line or the end of output
        assert line.startswith("window shown"), proc.stderr.read() if proc.poll() is not None else line
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.communicate(timeout=READY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def test_the_bundle_runs_a_gguf_on_the_real_llama_server(
    bundle: Path, mirror: Mirror, smol_gguf: Path, lemon_home: Path, no_orphans: None
) -> None:
    done = bundled(bundle, "run", str(smol_gguf), "--prompt", FRANCE, "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["backend"] == "llamacpp:cpu" and result["reply"].strip()
    assert result["telemetry"]["completion_tokens"] > 0
    # One click: the missing backend came from the (loopback) release mirror, into the shared home.
    assert installed_binary("llamacpp", "cpu") is not None


def test_the_bundle_installs_the_mlx_lm_backend_and_answers_with_a_real_mlx_model(
    bundle: Path, lemon_home: Path, no_orphans: None
) -> None:
    tiny_model = tiny_mlx_model()
    installed = bundled(bundle, "backends", "install", "lemon-mlx:mlx-lm", "--json")
    assert installed.returncode == 0, installed.stderr
    venv = install_dir("lemon-mlx", "mlx-lm")
    # The venv's Python is one uv found on this machine, not the bundle (which has no usable python).
    home = next(line for line in (venv / "pyvenv.cfg").read_text().splitlines() if line.startswith("home"))
    assert str(bundle) not in home
    done = bundled(
        bundle, "run", str(tiny_model), "--backend", "lemon-mlx:mlx-lm", "--prompt", "hi", "--json"
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["backend"] == "lemon-mlx:mlx-lm" and result["reply"]
    assert result["telemetry"]["completion_tokens"] > 0


def test_the_bundles_desktop_entry_starts_the_bundle(bundle: Path, tmp_path: Path) -> None:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "share")}
    argv = [str(bundle / "lemon-desk"), "--install-desktop-entry"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    entry = (tmp_path / "share" / "applications" / "lemon-desk.desktop").read_text()
    assert f"Exec={bundle / 'lemon-desk'}\n" in entry
    assert (tmp_path / "share" / "icons" / "hicolor" / "256x256" / "apps" / "lemon-desk.png").is_file()
