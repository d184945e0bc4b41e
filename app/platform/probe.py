"""Probe the machine: OS, CPU, RAM, AMD GPUs (KFD topology + DRM), NVIDIA (nvidia-smi), Apple Metal.

A probe never crashes or hangs the app: external commands have timeouts, and what could not be found
out is said in ``Hardware.notes``.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

import psutil

from app.core.errors import HardwareProfileError
from app.core.hardware import AmdGpu, Cpu, Hardware, Metal, NvidiaGpu, hardware_from_json
from app.core.matrix import SystemBinary

COMMAND_TIMEOUT_S = 3.0
KFD_NODES = Path("/sys/class/kfd/kfd/topology/nodes")
DRM = Path("/sys/class/drm")
GIB = 1024**3


def run_quietly(argv: list[str]) -> str | None:
    """Output of a short command, or None when it is missing, fails or takes too long."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def read_quietly(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def whole_number(text: str | None) -> int | None:
    """A count a tool or sysfs printed (``16106127360``), or None when it is no such number: only ASCII
    digits go to int() (``str.isdigit`` takes "²", which int() refuses)."""
    text = (text or "").strip()
    return int(text) if text.isascii() and text.isdigit() else None


def decimal(text: str | None) -> float | None:
    """A figure a tool printed (``24564``, ``37.5``), or None when it is no such number (``[N/A]``,
    ``1.2.3``, ``inf``, digits that are not ASCII)."""
    text = (text or "").strip()
    return float(text) if re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", text) else None


def _cpu_name(os_name: str) -> str:
    if os_name == "macos":
        return (run_quietly(["sysctl", "-n", "machdep.cpu.brand_string"]) or platform.processor()).strip()
    for line in (read_quietly(Path("/proc/cpuinfo")) or "").splitlines():
        if line.startswith(("model name", "Hardware", "Model")):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def _gfx_from_version(version: int) -> str:
    """KFD's gfx_target_version (e.g. 110501) to an LLVM target (gfx1151)."""
    major, minor, step = version // 10000, (version // 100) % 100, version % 100
    return f"gfx{major}{minor:x}{step:x}"


def _amd_gpus(notes: list[str]) -> list[AmdGpu]:
    if not KFD_NODES.is_dir():
        return []
    vram = sorted(
        size
        for card in DRM.glob("card*/device/mem_info_vram_total")
        if (size := whole_number(read_quietly(card))) is not None
    )
    gpus = []
    for node in sorted(KFD_NODES.iterdir()):
        props = dict(
            line.split(maxsplit=1)
            for line in (read_quietly(node / "properties") or "").splitlines()
            if " " in line
        )
        version = whole_number(props.get("gfx_target_version", "0"))
        if version is None:
            notes.append(f"Could not read the GPU target of KFD node {node.name}; left it out.")
            continue
        if version == 0:  # a CPU node
            continue
        name = (read_quietly(node / "name") or "AMD GPU").strip() or "AMD GPU"
        local_mem = whole_number(props.get("local_mem_size", "0")) or 0
        # An APU reports no local memory in KFD; its carve-out shows in the DRM node instead.
        integrated = local_mem == 0 or props.get("cpu_cores_count", "0") != "0"
        vram_bytes = local_mem or (vram.pop(0) if vram else 0)
        if vram_bytes == 0:
            notes.append(f"Could not read the VRAM size of AMD GPU {name}.")
        gpus.append(AmdGpu(name, _gfx_from_version(version), round(vram_bytes / GIB, 1), integrated))
    return gpus


def _nvidia_gpus(notes: list[str]) -> list[NvidiaGpu]:
    if shutil.which("nvidia-smi") is None:
        return []
    out = run_quietly(
        ["nvidia-smi", "--query-gpu=name,compute_cap,memory.total", "--format=csv,noheader,nounits"]
    )
    if out is None:
        notes.append("nvidia-smi is installed but did not answer; NVIDIA GPUs were not detected.")
        return []
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and re.fullmatch(r"\d+\.\d+", parts[1]):
            mib = decimal(parts[2]) or 0.0
            gpus.append(NvidiaGpu(parts[0], parts[1], round(mib / 1024, 1)))
    return gpus


def _probe() -> Hardware:
    notes: list[str] = []
    os_name = "macos" if platform.system() == "Darwin" else "linux"
    machine = platform.machine().lower()
    arch = "arm64" if machine in ("arm64", "aarch64") else "x86_64"
    cpu = Cpu(
        _cpu_name(os_name),
        psutil.cpu_count(logical=False) or os.cpu_count() or 1,
        psutil.cpu_count(logical=True) or 1,
    )
    memory_gb = round(psutil.virtual_memory().total / GIB, 1)
    metal = Metal(False, "")
    amd: list[AmdGpu] = []
    nvidia: list[NvidiaGpu] = []
    render = False
    if os_name == "macos":
        if arch == "arm64":
            metal = Metal(True, cpu.name)
    else:
        amd = _amd_gpus(notes)
        nvidia = _nvidia_gpus(notes)
        render = any(Path("/dev/dri").glob("renderD*"))
    return Hardware(os_name, arch, cpu, memory_gb, tuple(amd), tuple(nvidia), metal, render, tuple(notes))


def detect_hardware() -> Hardware:
    """The machine, or the profile ``LEMON_DESK_MOCK_HARDWARE`` names."""
    mock = os.environ.get("LEMON_DESK_MOCK_HARDWARE")
    if not mock:
        return _probe()
    hint = "Point LEMON_DESK_MOCK_HARDWARE at a valid profile, or unset it to probe this machine."
    try:
        return hardware_from_json(json.loads(Path(mock).read_text()))
    except OSError as err:
        raise HardwareProfileError(
            f"Cannot read the hardware profile {mock}: {err.strerror}.", hint
        ) from None
    except json.JSONDecodeError as err:
        what = f"it is not valid JSON (line {err.lineno})"
    except UnicodeDecodeError:
        what = "it is not UTF-8 text"
    except RecursionError:
        what = "it is nested too deeply to read"
    except HardwareProfileError as err:
        what = err.message
    raise HardwareProfileError(
        f"The hardware profile {mock} (LEMON_DESK_MOCK_HARDWARE) is malformed: {what}.", hint
    )


def find_system_llama_server(configured: str | None = None) -> SystemBinary | None:
    """A llama-server the user already has: the configured path, else PATH."""
    path = configured or shutil.which("llama-server")
    if not path or not os.access(path, os.X_OK):
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return SystemBinary(path, _llama_server_version(path, stat.st_size, stat.st_mtime_ns))


@functools.lru_cache(maxsize=8)
def _llama_server_version(path: str, size: int, mtime_ns: int) -> str:
    """``llama-server --version``, run once per binary (same size and modification time): it costs ~10 ms
    and every load asks for the backends' states, some more than once."""
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
        text = out.stdout + out.stderr
    except (OSError, subprocess.TimeoutExpired):
        text = ""
    match = re.search(r"version:\s*(\d+)", text)
    return f"b{match.group(1)}" if match else "unknown"
