"""Hardware detection: this machine for real, GPU sysfs trees as named fakes, and mock profiles."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from app.core.errors import HardwareProfileError
from app.core.hardware import hardware_from_json
from app.platform import detect_hardware, gpu, memory, probe
from tests.conftest import profile_path


def _sysctl(name: str) -> str:
    done = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, check=False)
    return done.stdout.strip()


def _expected_machine() -> tuple[str, str, float]:
    """(os, arch, RAM in GiB) of the machine the tests run on, learnt without the probe."""
    os_name = "macos" if sys.platform == "darwin" else "linux"
    arch = "arm64" if platform.machine().lower() in ("arm64", "aarch64") else "x86_64"
    if os_name == "macos":
        memory = int(_sysctl("hw.memsize"))
    else:
        meminfo = Path("/proc/meminfo").read_text()
        memory = int(next(line.split()[1] for line in meminfo.splitlines() if line.startswith("MemTotal:")))
        memory *= 1024
    return os_name, arch, memory / 1024**3


def _kfd_gpu_nodes() -> int:
    """GPU nodes in the AMD KFD topology (a CPU node's gfx_target_version is 0)."""
    nodes = Path("/sys/class/kfd/kfd/topology/nodes")
    count = 0
    for props in nodes.glob("*/properties") if nodes.is_dir() else []:
        for line in props.read_text().splitlines():
            if line.startswith("gfx_target_version ") and line.split()[1] != "0":
                count += 1
    return count


def test_this_machine_is_detected_without_waiting_on_a_command_and_correctly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Detection takes tens of milliseconds here; a command it waited on until its timeout would take
    # the whole timeout, made long here so that a machine ten times slower still passes well short of it.
    monkeypatch.setattr(probe, "COMMAND_TIMEOUT_S", 60.0)
    start = time.perf_counter()
    hw = detect_hardware()
    elapsed = time.perf_counter() - start
    assert elapsed < 30.0, f"detection took {elapsed:.2f}s"
    os_name, arch, memory_gb = _expected_machine()
    assert (hw.os, hw.arch) == (os_name, arch)
    assert hw.cpu.threads == os.cpu_count()
    assert 1 <= hw.cpu.cores <= hw.cpu.threads
    assert abs(hw.memory_gb - memory_gb) <= 0.1
    # Metal: every Apple Silicon Mac (hw.optional.arm64 is 1 even for a Python under Rosetta).
    apple_silicon = os_name == "macos" and _sysctl("hw.optional.arm64") == "1"
    assert hw.metal.available == (apple_silicon and arch == "arm64")
    if os_name == "macos":
        assert hw.amd_gpu == () and hw.nvidia_gpu == ()
        return
    assert len(hw.amd_gpu) == _kfd_gpu_nodes()
    nvidia_driver = Path("/proc/driver/nvidia/gpus")
    nvidia = len(list(nvidia_driver.iterdir())) if nvidia_driver.is_dir() else 0
    # The probe asks nvidia-smi; without it (or without the driver) no NVIDIA GPU is reported.
    assert len(hw.nvidia_gpu) == (nvidia if shutil.which("nvidia-smi") else 0)
    assert hw.render_device == any(Path("/dev/dri").glob("renderD*"))


def _fake_sysfs(root: Path, nodes: dict[str, dict[str, str]], vram: list[int]) -> None:
    """A stand-in KFD topology and DRM tree, as an AMD machine would have (there is no GPU here)."""
    for name, props in nodes.items():
        node = root / "kfd" / name
        node.mkdir(parents=True)
        (node / "properties").write_text("".join(f"{k} {v}\n" for k, v in props.items()))
        (node / "name").write_text(props.get("_name", "") + "\n")
    for i, size in enumerate(vram):
        dev = root / "drm" / f"card{i}" / "device"
        dev.mkdir(parents=True)
        (dev / "mem_info_vram_total").write_text(f"{size}\n")


def test_amd_gpus_from_kfd_topology(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gib = 1024**3
    _fake_sysfs(
        tmp_path,
        {
            "0": {"cpu_cores_count": "16", "gfx_target_version": "0"},
            "1": {
                "cpu_cores_count": "0",
                "gfx_target_version": "120001",
                "local_mem_size": str(16 * gib),
                "_name": "gfx1201",
            },
            "2": {
                "cpu_cores_count": "0",
                "gfx_target_version": "100306",
                "local_mem_size": "0",
                "_name": "ip discovery",
            },
        },
        vram=[512 * 1024**2],
    )
    monkeypatch.setattr(probe, "KFD_NODES", tmp_path / "kfd")
    monkeypatch.setattr(probe, "DRM", tmp_path / "drm")
    notes: list[str] = []
    gpus = probe._amd_gpus(notes)
    assert [(g.gfx, g.vram_gb, g.integrated) for g in gpus] == [
        ("gfx1201", 16.0, False),
        ("gfx1036", 0.5, True),
    ]
    assert notes == []


def test_odd_sysfs_numbers_count_as_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """str.isdigit() takes "²", which int() refuses: such a file raised ValueError from the probe, the
    sampler and the free-memory check. Now only ASCII digits count; anything else is unknown."""
    _fake_sysfs(
        tmp_path,
        {
            "1": {"cpu_cores_count": "0", "gfx_target_version": "11050²", "_name": "odd"},
            "2": {
                "cpu_cores_count": "0",
                "gfx_target_version": "110501",
                "local_mem_size": "²",
                "_name": "apu",
            },
        },
        vram=[512 * 1024**2],
    )
    odd = tmp_path / "drm" / "card1" / "device"  # a second DRM card whose files are not numbers
    odd.mkdir(parents=True)
    for name, text in (
        ("mem_info_vram_total", "1²\n"),
        ("mem_info_vram_used", "²"),
        ("gpu_busy_percent", "²"),
    ):
        (odd / name).write_text(text)
    (tmp_path / "drm" / "card0" / "device" / "mem_info_vram_used").write_text("3\n")
    monkeypatch.setattr(probe, "KFD_NODES", tmp_path / "kfd")
    monkeypatch.setattr(probe, "DRM", tmp_path / "drm")
    monkeypatch.setattr(memory, "DRM", tmp_path / "drm")
    notes: list[str] = []
    assert [(g.gfx, g.vram_gb, g.integrated) for g in probe._amd_gpus(notes)] == [("gfx1151", 0.5, True)]
    assert notes == ["Could not read the GPU target of KFD node 1; left it out."]
    assert gpu._amd(tmp_path / "drm") == gpu.GpuNow(None, 3, 512 * 1024**2, {})
    assert memory._amd_vram_free() == 512 * 1024**2 - 3


def test_odd_nvidia_smi_output_counts_as_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake nvidia-smi (this machine has no NVIDIA GPU) printing figures that are no numbers: '1.2.3'
    passed the old check and float() raised; '12²3' passed isdigit() and int() raised."""
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        '  *compute_cap*) echo "NVIDIA GeForce RTX 4090, 8.9, 1.2.3";;\n'
        '  *utilization.gpu*) printf "37, 1024, 24564\\n[N/A], ²4, 24564\\n";;\n'
        '  *compute-apps*) printf "12²3, 500\\n77, 512\\n";;\n'
        '  *memory.free*) printf "1.2.3\\n²\\n2048\\n";;\n'
        "esac\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    assert [(g.name, g.vram_gb) for g in probe._nvidia_gpus([])] == [("NVIDIA GeForce RTX 4090", 0.0)]
    mib = 1024**2
    assert gpu._nvidia_smi() == gpu.GpuNow(37.0, 1024 * mib, 24564 * mib, {77: 512 * mib})
    assert memory._nvidia_vram_free() == 2048 * mib


def test_gfx_target_versions() -> None:
    assert probe._gfx_from_version(110501) == "gfx1151"
    assert probe._gfx_from_version(110000) == "gfx1100"
    assert probe._gfx_from_version(90010) == "gfx90a"


def test_missing_nvidia_smi_is_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert probe._nvidia_gpus([]) == []


def test_hanging_command_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "COMMAND_TIMEOUT_S", 0.2)
    start = time.perf_counter()
    assert probe.run_quietly([sys.executable, "-c", "import time; time.sleep(300)"]) is None
    assert time.perf_counter() - start < 30  # the 0.2 s timeout, far short of the command's 300 s


def test_mock_profile_replaces_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("strix_halo")))
    hw = detect_hardware()
    assert hw.amd_gpu[0].gfx == "gfx1151" and hw.memory_gb == 128


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda p: p.pop("arch"), "missing field 'arch'"),
        (lambda p: p.update(os="windows"), "field 'os' must be one of linux, macos"),
        (lambda p: p["cpu"].pop("cores"), "missing field 'cpu.cores'"),
        (lambda p: p.update(memory_gb="lots"), "field 'memory_gb' has the wrong type"),
        (
            lambda p: p["amd_gpu"][0].update(integrated="yes"),
            "field 'amd_gpu[0].integrated' has the wrong type",
        ),
        (lambda p: p["amd_gpu"][0].pop("gfx"), "missing field 'amd_gpu[0].gfx'"),
        (lambda p: p.update(nvidia_gpu={}), "field 'nvidia_gpu' must be a list of objects"),
        (lambda p: p.update(memory_gb=float("inf")), "field 'memory_gb' must be a finite number of GB"),
        (lambda p: p["amd_gpu"][0].update(vram_gb=-1), "field 'amd_gpu[0].vram_gb' must be a finite number"),
        (lambda p: p["cpu"].update(threads=0), "field 'cpu.threads' must be 1 or more"),
        (lambda p: p.update(notes=[1]), "field 'notes' must be a list of strings"),
    ],
)
def test_bad_profile_names_the_field(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    data = json.loads(profile_path("strix_halo").read_text())
    mutate(data)
    with pytest.raises(HardwareProfileError, match=message.replace("[", r"\[").replace("]", r"\]")):
        hardware_from_json(data)


def test_profile_round_trips_through_json() -> None:
    data = json.loads(profile_path("amd_nvidia_hybrid").read_text())
    hw = hardware_from_json(data)
    assert hardware_from_json(hw.to_json()) == hw


STRIX_HALO = profile_path("strix_halo").read_bytes()


def _cli(*args: str, env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    import os

    env = {**os.environ, **env_extra}
    return subprocess.run(
        [sys.executable, "-m", "app", *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def test_cli_system_info_json_shape() -> None:
    done = _cli(
        "system-info", "--json", env_extra={"LEMON_DESK_MOCK_HARDWARE": str(profile_path("strix_halo"))}
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert set(data) == {"hardware", "recipes"}
    assert data["hardware"]["amd_gpu"][0] == {
        "name": "Radeon 8060S",
        "gfx": "gfx1151",
        "vram_gb": 96.0,
        "integrated": True,
    }
    rocm = data["recipes"]["lemon-mlx"]["backends"]["rocm"]
    assert rocm == {
        "state": "installable",
        "message": "Can be installed (b1050-stable).",
        "version": "b1050-stable",
        "asset": "mlx-engine-b1050-stable-ubuntu-rocm-x64.zip",
        "url": "https://github.com/lemonade-sdk/lemon-mlx-engine/releases/download/b1050-stable/"
        "mlx-engine-b1050-stable-ubuntu-rocm-x64.zip",
    }
    assert data["recipes"]["llamacpp"]["default_backend"] == "rocm"
    assert set(data["recipes"]["llamacpp"]["backends"]["metal"]) == {"state", "message", "version"}


def test_cli_system_info_table() -> None:
    done = _cli("system-info", env_extra={"LEMON_DESK_MOCK_HARDWARE": str(profile_path("intel_mac"))})
    assert done.returncode == 0, done.stderr
    assert "lemon-mlx (default: none)" in done.stdout
    assert "No lemon-mlx build exists for Intel Macs" in done.stdout


@pytest.mark.parametrize(
    ("content", "what"),
    [
        (b"{not json", "is not valid JSON (line 1)"),
        (b'{"os": "linux"}', "missing field 'arch'"),
        # These were tracebacks: UnicodeDecodeError, RecursionError, OverflowError, TypeError.
        (b"\xff\xfe{}", "is not UTF-8 text"),
        (b"[" * 100_000, "is nested too deeply"),
        (STRIX_HALO.replace(b": 128", b": 1" + b"0" * 400), "field 'memory_gb' must be a finite number"),
        (STRIX_HALO.replace(b'"nvidia_gpu": []', b'"notes": 5'), "field 'notes' must be a list of strings"),
    ],
)
def test_cli_bad_profile_is_one_clear_line(tmp_path: Path, content: bytes, what: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    done = _cli("system-info", "--json", env_extra={"LEMON_DESK_MOCK_HARDWARE": str(bad)})
    assert done.returncode != 0
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in done.stderr
    assert (
        f"The hardware profile {bad} (LEMON_DESK_MOCK_HARDWARE) is malformed: " in lines[0]
        and what in lines[0]
    )


def test_backend_versions_override(tmp_path: Path) -> None:
    from app.store.catalog import backend_versions_path

    raw = json.loads(backend_versions_path().read_text())
    raw["recipes"]["llamacpp"]["cpu"]["version"] = "b99999"
    override = tmp_path / "versions.json"
    override.write_text(json.dumps(raw))
    done = _cli(
        "system-info",
        "--json",
        env_extra={
            "LEMON_DESK_MOCK_HARDWARE": str(profile_path("cpu_only_x86")),
            "LEMON_DESK_BACKEND_VERSIONS": str(override),
        },
    )
    assert json.loads(done.stdout)["recipes"]["llamacpp"]["backends"]["cpu"]["asset"] == (
        "llama-b99999-bin-ubuntu-x64.tar.gz"
    )


def _llamacpp(raw: dict[str, Any]) -> Any:
    return raw["recipes"]["llamacpp"]


@pytest.mark.parametrize(
    ("mutate", "what"),
    [  # each was a traceback (AttributeError, TypeError) or, for the packages, a list of letters
        (lambda raw: raw["recipes"].update(llamacpp=[1]), "'llamacpp' in recipes has the wrong type"),
        (
            lambda raw: raw.update(rocm_families={"gfx110X": 5}),
            "ROCm family gfx110X must be a list of strings",
        ),
        (lambda raw: _llamacpp(raw)["cpu"].update(assets=[5]), "llamacpp:cpu asset 0 must be an object"),
        (
            lambda raw: _llamacpp(raw)["cpu"]["assets"][0].update(min_build="new"),
            "'min_build' in llamacpp:cpu asset 0 has the wrong type",
        ),
        (lambda raw: _llamacpp(raw)["rocm"].update(vars=[1]), "'vars' in llamacpp:rocm has the wrong type"),
        (
            lambda raw: raw["recipes"]["lemon-mlx"]["mlx-lm"]["packages"].update(linux="mlx"),
            "lemon-mlx:mlx-lm's linux packages must be a list of strings",
        ),
    ],
)
def test_a_malformed_backend_versions_override_is_one_clear_line(  # type: ignore[no-untyped-def]
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], mutate, what: str
) -> None:
    from app.cli import main
    from app.store.catalog import backend_versions_path

    raw = json.loads(backend_versions_path().read_text())
    mutate(raw)
    override = tmp_path / "versions.json"
    override.write_text(json.dumps(raw))
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))
    monkeypatch.setenv("LEMON_DESK_BACKEND_VERSIONS", str(override))
    assert main(["system-info", "--json"]) != 0
    out, err = capsys.readouterr()
    assert out == "" and err == (
        f"error: Cannot use the backend versions file {override} (LEMON_DESK_BACKEND_VERSIONS): {what}. "
        "Point LEMON_DESK_BACKEND_VERSIONS at a valid file, or unset it to use the bundled pins.\n"
    )


@pytest.mark.parametrize(
    ("content", "what"), [(b"\xff{}", "can't decode byte 0xff"), (b"[" * 100_000, "nested too deeply")]
)
def test_a_backend_versions_override_that_is_no_json_is_one_clear_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    content: bytes,
    what: str,
) -> None:
    from app.cli import main

    override = tmp_path / "versions.json"
    override.write_bytes(content)
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))
    monkeypatch.setenv("LEMON_DESK_BACKEND_VERSIONS", str(override))
    assert main(["system-info", "--json"]) != 0
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: Cannot read the backend versions file {override} (LEMON_DESK_BACKEND_VERSIONS): "
    )
    assert what in err and err.count("\n") == 1


def test_cli_output_into_a_closed_pipe_is_not_a_traceback() -> None:
    import os

    reader, writer = os.pipe()
    os.close(reader)
    done = subprocess.run(
        [sys.executable, "-m", "app", "system-info"],
        stdout=writer,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
    )
    os.close(writer)
    assert done.returncode == 0
    assert "Traceback" not in done.stderr
