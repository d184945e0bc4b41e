"""The hardware profile: what the machine has, as PRODUCT.md's JSON shape, validated."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from app.core.errors import HardwareProfileError
from app.core.numbers import finite

OPERATING_SYSTEMS = ("linux", "macos")
ARCHITECTURES = ("x86_64", "arm64")


@dataclass(frozen=True)
class Cpu:
    name: str
    cores: int
    threads: int


@dataclass(frozen=True)
class AmdGpu:
    name: str
    gfx: str  # LLVM target, e.g. "gfx1151"
    vram_gb: float
    integrated: bool


@dataclass(frozen=True)
class NvidiaGpu:
    name: str
    compute_capability: str  # e.g. "8.9"
    vram_gb: float


@dataclass(frozen=True)
class Metal:
    available: bool
    name: str


@dataclass(frozen=True)
class Hardware:
    os: str
    arch: str
    cpu: Cpu
    memory_gb: float
    amd_gpu: tuple[AmdGpu, ...] = ()
    nvidia_gpu: tuple[NvidiaGpu, ...] = ()
    metal: Metal = Metal(False, "")
    render_device: bool = False  # some /dev/dri render node exists (Vulkan may work)
    notes: tuple[str, ...] = field(default=())  # what a probe could not find out, in words

    @property
    def platform(self) -> str:
        """``os-arch``, the key release assets are chosen by."""
        return f"{self.os}-{self.arch}"

    @property
    def has_gpu(self) -> bool:
        return bool(self.amd_gpu or self.nvidia_gpu or self.metal.available or self.render_device)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["amd_gpu"] = [asdict(g) for g in self.amd_gpu]
        data["nvidia_gpu"] = [asdict(g) for g in self.nvidia_gpu]
        data["notes"] = list(self.notes)
        return data


def _field(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise HardwareProfileError(f"missing field '{where}{key}'")
    value = obj[key]
    # bool is an int to Python, but not to a person writing a profile.
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise HardwareProfileError(f"field '{where}{key}' has the wrong type")
    return value


def _list(obj: dict[str, Any], key: str) -> list[dict[str, Any]]:
    items = obj.get(key, [])
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise HardwareProfileError(f"field '{key}' must be a list of objects")
    return items


def _count(obj: dict[str, Any], key: str, where: str) -> int:
    value: int = _field(obj, key, int, where)
    if value < 1:
        raise HardwareProfileError(f"field '{where}{key}' must be 1 or more")
    return value


def _gb(obj: dict[str, Any], key: str, where: str) -> float:
    value = finite(_field(obj, key, (int, float), where))
    if value is None or value < 0:
        raise HardwareProfileError(f"field '{where}{key}' must be a finite number of GB, 0 or more")
    return value


def hardware_from_json(data: Any) -> Hardware:
    """Validate a profile; a bad one raises HardwareProfileError saying which field is wrong and how
    (the caller names the file)."""
    if not isinstance(data, dict):
        raise HardwareProfileError("the file must hold a JSON object")
    os_name = _field(data, "os", str, "")
    if os_name not in OPERATING_SYSTEMS:
        raise HardwareProfileError(f"field 'os' must be one of {', '.join(OPERATING_SYSTEMS)}")
    arch = _field(data, "arch", str, "")
    if arch not in ARCHITECTURES:
        raise HardwareProfileError(f"field 'arch' must be one of {', '.join(ARCHITECTURES)}")
    cpu = _field(data, "cpu", dict, "")
    notes = data.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise HardwareProfileError("field 'notes' must be a list of strings")
    metal = data.get("metal", {"available": False, "name": ""})
    if not isinstance(metal, dict):
        raise HardwareProfileError("field 'metal' must be an object")
    return Hardware(
        os=os_name,
        arch=arch,
        cpu=Cpu(
            name=_field(cpu, "name", str, "cpu."),
            cores=_count(cpu, "cores", "cpu."),
            threads=_count(cpu, "threads", "cpu."),
        ),
        memory_gb=_gb(data, "memory_gb", ""),
        amd_gpu=tuple(
            AmdGpu(
                name=_field(g, "name", str, f"amd_gpu[{i}]."),
                gfx=_field(g, "gfx", str, f"amd_gpu[{i}]."),
                vram_gb=_gb(g, "vram_gb", f"amd_gpu[{i}]."),
                integrated=_field(g, "integrated", bool, f"amd_gpu[{i}]."),
            )
            for i, g in enumerate(_list(data, "amd_gpu"))
        ),
        nvidia_gpu=tuple(
            NvidiaGpu(
                name=_field(g, "name", str, f"nvidia_gpu[{i}]."),
                compute_capability=_field(g, "compute_capability", str, f"nvidia_gpu[{i}]."),
                vram_gb=_gb(g, "vram_gb", f"nvidia_gpu[{i}]."),
            )
            for i, g in enumerate(_list(data, "nvidia_gpu"))
        ),
        metal=Metal(
            available=_field(metal, "available", bool, "metal."),
            name=str(metal.get("name", "")),
        ),
        render_device=bool(data.get("render_device", False)),
        notes=tuple(notes),
    )
