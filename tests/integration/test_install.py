"""Installing llamacpp:cpu from a loopback release mirror: the real archive of the real llama-server.

Only GitHub is stood in for (a loopback server through LEMON_DESK_RELEASE_MIRROR); download, digest,
unpacking, the swap and the engine that runs afterwards are all real.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from app.store.installs import install_dir, read_manifest
from app.store.library import location_on_demand
from app.store.paths import staging_dir
from app.store.settings import Settings
from app.supervisor.installer import InstallPhase
from app.supervisor.supervisor import InstallFinished, InstallProgress, Supervisor, SupervisorEvent
from tests.integration.conftest import ASSET, TAG, Mirror, lemon_desk, release_path
from tests.support.fileserver import Fault

pytestmark = pytest.mark.integration


def installed() -> Path:
    return install_dir("llamacpp", "cpu")


def assert_nothing_installed_and_no_temp_files(lemon_home: Path) -> None:
    assert not installed().exists()
    assert not staging_dir().exists()
    leftovers = [p for p in lemon_home.rglob("*") if p.is_file()]
    assert leftovers == [], leftovers


def test_install_then_run_streams_a_coherent_reply(mirror: Mirror, smol_gguf: Path, lemon_home: Path) -> None:
    done = lemon_desk("backends", "install", "llamacpp:cpu")
    assert done.returncode == 0, done.stderr
    manifest = read_manifest(installed())
    assert manifest is not None and manifest.version == TAG and manifest.asset == ASSET
    assert f"sha256 {manifest.sha256}" in done.stdout
    assert (installed() / f"llama-{TAG}" / "llama-server").stat().st_mode & 0o100
    assert not staging_dir().exists()

    listed = json.loads(lemon_desk("backends", "--json").stdout)
    cpu = listed["recipes"]["llamacpp"]["backends"]["cpu"]
    assert cpu["state"] == "installed" and cpu["installed_version"] == TAG

    run = lemon_desk(
        "run",
        str(smol_gguf),
        "--prompt",
        "What is the capital of France? Answer in one word.",
        "--args",
        "--temp 0 -n 48",
        "--json",
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["model"] == smol_gguf.stem and result["backend"] == "llamacpp:cpu"
    assert "Paris" in result["reply"]
    telemetry = result["telemetry"]
    assert set(telemetry) == {
        "ttft_s",
        "prompt_tokens",
        "prompt_tps",
        "completion_tokens",
        "decode_tps",
        "cached_tokens",
    }
    assert telemetry["cached_tokens"] == 0, "a first request has nothing cached"
    assert all(value > 0 for key, value in telemetry.items() if key != "cached_tokens"), telemetry


def test_plain_run_streams_to_stdout_and_telemetry_to_stderr(mirror: Mirror, smol_gguf: Path) -> None:
    assert lemon_desk("backends", "install", "llamacpp:cpu").returncode == 0
    run = lemon_desk(
        "run",
        str(smol_gguf),
        "--prompt",
        "What is the capital of France? Answer in one word.",
        "--args",
        "--temp 0 -n 48",
    )
    assert run.returncode == 0, run.stderr
    assert "Paris" in run.stdout
    assert "time to first token" in run.stderr and "tok/s" in run.stderr


def test_progress_events_then_finished(mirror: Mirror) -> None:
    events: list[SupervisorEvent] = []

    async def go() -> None:
        async with Supervisor(Settings(), resolve_model=location_on_demand(Settings())) as supervisor:
            supervisor.subscribe(events.append)
            await supervisor.install("llamacpp", "cpu")

    asyncio.run(go())
    progress = [e for e in events if isinstance(e, InstallProgress)]
    downloads = [e for e in progress if e.phase is InstallPhase.DOWNLOADING and e.total]
    assert downloads and downloads[-1].done == downloads[-1].total == len(mirror.tarball)
    assert downloads[-1].speed_bps > 0
    assert progress[-1].phase is InstallPhase.UNPACKING
    assert isinstance(events[-1], InstallFinished) and events[-1].version == TAG


def test_bad_digest_is_refused_and_deleted(mirror: Mirror, lemon_home: Path) -> None:
    mirror.publish(mirror.tarball, sha256="0" * 64)
    done = lemon_desk("backends", "install", "llamacpp:cpu")
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith(
        f"error: Could not install llamacpp:cpu: {ASSET} is corrupt: its SHA-256 is "
    )
    assert "Traceback" not in done.stderr
    assert_nothing_installed_and_no_temp_files(lemon_home)


def test_truncated_archive_is_refused(mirror: Mirror, lemon_home: Path) -> None:
    mirror.publish(mirror.tarball[: len(mirror.tarball) // 2], sha256=None)  # no digest to catch it early
    done = lemon_desk("backends", "install", "llamacpp:cpu")
    assert done.returncode == 1
    assert f"error: {ASSET} is damaged and cannot be unpacked" in done.stderr
    assert_nothing_installed_and_no_temp_files(lemon_home)


def hostile(member: tarfile.TarInfo, data: bytes = b"#!/bin/sh\necho owned\n") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        good = tarfile.TarInfo(f"llama-{TAG}/llama-server")
        good.size, good.mode = 4, 0o755
        tar.addfile(good, io.BytesIO(b"\x7fELF"))
        if member.isreg():
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
        else:
            tar.addfile(member)
    return buf.getvalue()


def symlink(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info


@pytest.mark.parametrize(
    "member",
    [
        tarfile.TarInfo(f"llama-{TAG}/../../../escaped.sh"),
        tarfile.TarInfo("/tmp/lemon-desk-test-escaped.sh"),
        symlink(f"llama-{TAG}/libggml.so", "../../../../../../etc/passwd"),
        symlink(f"llama-{TAG}/abs", "/etc"),
    ],
    ids=["dot-dot", "absolute", "symlink-up", "symlink-absolute"],
)
def test_path_traversal_archive_is_refused(
    mirror: Mirror, lemon_home: Path, tmp_path: Path, member: tarfile.TarInfo
) -> None:
    mirror.publish(hostile(member))
    done = lemon_desk("backends", "install", "llamacpp:cpu")
    assert done.returncode == 1
    assert "is unsafe" in done.stderr and "Nothing was installed" in done.stderr
    assert_nothing_installed_and_no_temp_files(lemon_home)
    assert not list(tmp_path.rglob("escaped.sh")) and not Path("/tmp/lemon-desk-test-escaped.sh").exists()


def test_unsupported_backend_is_refused_before_any_download(mirror: Mirror) -> None:
    done = lemon_desk("backends", "install", "llamacpp:vulkan")
    assert done.returncode == 1
    assert (
        done.stderr
        == "error: llamacpp:vulkan cannot run on this machine: Vulkan needs a GPU; none was found.\n"
    )
    assert mirror.served.log == []


def test_a_crashed_download_is_resumed_with_a_range_request(mirror: Mirror) -> None:
    half = len(mirror.tarball) // 2
    part = staging_dir() / "llamacpp-cpu" / f"{ASSET}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(mirror.tarball[:half])  # what a killed install leaves behind
    assert lemon_desk("backends", "install", "llamacpp:cpu").returncode == 0
    assert mirror.served.bytes_sent(release_path(TAG, ASSET)) == [f"bytes={half}-"]
    assert read_manifest(installed()) is not None


def test_update_keeps_the_old_install_until_the_new_one_is_complete(mirror: Mirror, lemon_home: Path) -> None:
    assert lemon_desk("backends", "install", "llamacpp:cpu").returncode == 0
    old_binary = installed() / f"llama-{TAG}" / "llama-server"

    mirror.publish(mirror.tarball[:1000], tag="b10400", sha256=None)  # a new pin whose asset is broken
    listed = json.loads(lemon_desk("backends", "--json").stdout)["recipes"]["llamacpp"]["backends"]["cpu"]
    assert (listed["state"], listed["installed_version"], listed["version"]) == (
        "update_required",
        TAG,
        "b10400",
    )
    assert lemon_desk("backends", "install", "llamacpp:cpu").returncode == 1
    manifest = read_manifest(installed())
    assert manifest is not None and manifest.version == TAG and old_binary.exists()

    mirror.publish(mirror.tarball, tag="b10400")  # the same files, published under the new pin
    assert lemon_desk("backends", "install", "llamacpp:cpu").returncode == 0
    manifest = read_manifest(installed())
    assert manifest is not None and manifest.version == "b10400"
    assert not staging_dir().exists()


def test_uninstall(mirror: Mirror, lemon_home: Path) -> None:
    assert lemon_desk("backends", "install", "llamacpp:cpu").returncode == 0
    done = lemon_desk("backends", "uninstall", "llamacpp:cpu")
    assert (done.returncode, done.stdout) == (0, "Removed llamacpp:cpu.\n")
    assert_nothing_installed_and_no_temp_files(lemon_home)
    again = lemon_desk("backends", "uninstall", "llamacpp:cpu")
    assert (again.returncode, again.stdout) == (0, "llamacpp:cpu was not installed.\n")


def test_ctrl_c_during_install_leaves_nothing_behind(mirror: Mirror, lemon_home: Path) -> None:
    path = release_path(TAG, ASSET)
    mirror.served.arm(path, Fault(stall_s=30))  # headers now, body only after 30 s
    cli = subprocess.Popen(
        [sys.executable, "-m", "app", "backends", "install", "llamacpp:cpu"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    part = staging_dir() / "llamacpp-cpu" / f"{ASSET}.part"
    deadline = time.monotonic() + 60
    while not part.exists():  # the download has begun: its partial file is open
        assert cli.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(cli.pid, signal.SIGINT)
    _, err = cli.communicate(timeout=60)
    assert cli.returncode == 130, err
    assert err.strip().endswith("interrupted") and "Traceback" not in err
    assert_nothing_installed_and_no_temp_files(lemon_home)
