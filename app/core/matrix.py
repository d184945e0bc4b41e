"""The support matrix: for each recipe and backend, whether it runs here, and the default.

Every "unsupported" carries a sentence a user understands; nothing here downloads or probes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.core.backends import (
    GITHUB,
    PREFERENCE,
    BackendKey,
    BackendKind,
    BackendSpec,
    BackendState,
    BackendVersions,
)
from app.core.hardware import AmdGpu, Hardware

DISCRETE_MIN_VRAM_GB = 4.0


@dataclass(frozen=True)
class SystemBinary:
    """An engine the user already has (e.g. ``llama-server`` on PATH)."""

    path: str
    version: str


@dataclass(frozen=True)
class BackendStatus:
    recipe: str
    backend: str
    state: BackendState
    message: str
    version: str
    asset: str | None = None
    url: str | None = None
    installed_version: str | None = None
    # Release assets: how the download is (or was) checked. "pin" (backend_versions.json), "release"
    # (the digest GitHub's release API gives), "unverified" (installed with no digest to check), or
    # None (not a release asset, or not installed and not pinned: the release API is asked at install).
    digest: str | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"state": self.state.value, "message": self.message, "version": self.version}
        if self.asset is not None:
            data["asset"] = self.asset
            data["url"] = self.url
        if self.digest is not None:
            data["digest"] = self.digest
        return data

    @property
    def shown_message(self) -> str:
        """The message, saying so when the installed files were never checked against a digest."""
        return (
            f"{self.message} (unverified: no SHA-256 to check it against)"
            if self.digest == "unverified"
            else self.message
        )


@dataclass(frozen=True)
class RecipeSupport:
    recipe: str
    default_backend: str | None
    backends: dict[str, BackendStatus]

    def to_json(self) -> dict[str, Any]:
        return {
            "default_backend": self.default_backend,
            "backends": {name: status.to_json() for name, status in self.backends.items()},
        }


def best_amd_gpu(gpus: tuple[AmdGpu, ...]) -> AmdGpu | None:
    """Most VRAM first; on a tie a discrete GPU (>= 4 GB) wins over an integrated one."""
    if not gpus:
        return None
    return max(gpus, key=lambda g: (g.vram_gb, not g.integrated and g.vram_gb >= DISCRETE_MIN_VRAM_GB))


def _cuda_arch(hw: Hardware) -> str:
    """Highest compute capability present, as in ``sm_89``'s ``89``."""
    best = max(hw.nvidia_gpu, key=lambda g: tuple(int(p) for p in g.compute_capability.split(".")))
    return best.compute_capability.replace(".", "")


def _platform_name(hw: Hardware) -> str:
    if hw.os == "macos":
        return "Macs with Apple Silicon" if hw.arch == "arm64" else "Intel Macs"
    return f"Linux {hw.arch}"


class _Unsupported(Exception):
    """Raised by the rule functions below; its text is the user's explanation."""


def _rocm_family(hw: Hardware, versions: BackendVersions) -> str:
    """The ROCm family of the best AMD GPU, or _Unsupported saying why there is none."""
    if hw.os != "linux":
        raise _Unsupported("ROCm builds are for Linux with an AMD GPU.")
    gpu = best_amd_gpu(hw.amd_gpu)
    if gpu is None:
        raise _Unsupported("ROCm needs an AMD GPU; none was found.")
    family = versions.gfx_family(gpu.gfx)
    if family is None:
        supported = ", ".join(versions.rocm_families)
        raise _Unsupported(
            f"Your AMD GPU ({gpu.name}, {gpu.gfx}) is not supported by ROCm builds (supported: {supported})."
        )
    return family


def _llamacpp_values(backend: str, hw: Hardware, versions: BackendVersions) -> dict[str, str]:
    """Checks that a llama.cpp backend can run here; returns the asset-name values it needs."""
    if backend == "metal":
        if (hw.os, hw.arch) != ("macos", "arm64"):
            raise _Unsupported("Metal builds are for Macs with Apple Silicon.")
    elif backend == "cuda":
        if hw.os != "linux" or not hw.nvidia_gpu:
            raise _Unsupported("CUDA builds need an NVIDIA GPU on Linux; none was found.")
        return {"cuda_arch": _cuda_arch(hw)}
    elif backend == "rocm":
        return {"gfx_family": _rocm_family(hw, versions)}
    elif backend == "vulkan":
        if hw.os != "linux":
            raise _Unsupported("Vulkan builds are for Linux; on a Mac use Metal.")
        if not hw.has_gpu:
            raise _Unsupported("Vulkan needs a GPU; none was found.")
    elif backend == "cpu" and hw.os != "linux":
        raise _Unsupported("llama.cpp's CPU builds are for Linux; on a Mac use Metal.")
    return {}


def _lemon_mlx_values(backend: str, hw: Hardware, versions: BackendVersions) -> dict[str, str]:
    """Checks that a lemon-mlx backend can run here; returns the asset-name values it needs."""
    if backend == "mlx-lm":
        return {}
    no_build = f"No lemon-mlx build exists for {_platform_name(hw)}."
    if (hw.os, hw.arch) not in (("macos", "arm64"), ("linux", "x86_64")):
        raise _Unsupported(f"{no_build} Use the mlx-lm backend instead.")
    if backend == "metal" and hw.os != "macos":
        raise _Unsupported("Metal builds are for Macs with Apple Silicon.")
    if backend == "rocm":
        return {"gfx_family": _rocm_family(hw, versions)}
    return {}


_RULES = {"llamacpp": _llamacpp_values, "lemon-mlx": _lemon_mlx_values}


def _status(
    spec: BackendSpec,
    hw: Hardware,
    versions: BackendVersions,
    installed: Mapping[BackendKey, str],
    system_binary: SystemBinary | None,
    release_base: str,
) -> BackendStatus:
    def make(state: BackendState, message: str, **kw: Any) -> BackendStatus:
        return BackendStatus(spec.recipe, spec.name, state, message, kw.pop("version", spec.version), **kw)

    if spec.kind is BackendKind.SYSTEM:
        if system_binary is None:
            return make(
                BackendState.UNSUPPORTED,
                f"No {spec.binary} was found on PATH. Install llama.cpp or set its path in Settings.",
            )
        return make(
            BackendState.INSTALLED,
            f"Uses {system_binary.path}.",
            version=system_binary.version,
            installed_version=system_binary.version,
        )
    try:
        values = _RULES[spec.recipe](spec.name, hw, versions)
    except _Unsupported as why:
        return make(BackendState.UNSUPPORTED, str(why))

    asset = url = None
    if spec.kind is BackendKind.PIP:
        if hw.platform not in spec.platforms:
            return make(BackendState.UNSUPPORTED, f"No {spec.name} wheels exist for {_platform_name(hw)}.")
    else:
        asset = spec.asset_name(hw.platform, **values)
        if asset is None:
            return make(
                BackendState.UNSUPPORTED,
                f"No {spec.recipe} {spec.name} build exists for {_platform_name(hw)}.",
            )
        url = spec.asset_url(asset, release_base)

    have = installed.get(spec.key)
    if have is None:
        state, message = BackendState.INSTALLABLE, f"Can be installed ({spec.version})."
    elif have == spec.version:
        state, message = BackendState.INSTALLED, f"Installed ({have})."
    else:
        state = BackendState.UPDATE_REQUIRED
        message = f"Installed {have}, but {spec.version} is pinned. Update to use it."
    return make(state, message, asset=asset, url=url, installed_version=have)


def default_backend(statuses: Mapping[str, BackendStatus]) -> str | None:
    """Installed beats installable; then the preference order; never an unsupported one."""
    ranked = [
        s for name in PREFERENCE if (s := statuses.get(name)) and s.state is not BackendState.UNSUPPORTED
    ]
    installed = [s for s in ranked if s.state is not BackendState.INSTALLABLE]
    pick = installed or ranked
    return pick[0].backend if pick else None


def support_matrix(
    hw: Hardware,
    versions: BackendVersions,
    installed: Mapping[BackendKey, str] | None = None,
    system_binary: SystemBinary | None = None,
    release_base: str = GITHUB,
) -> dict[str, RecipeSupport]:
    """State of every backend of every recipe on this machine."""
    result = {}
    for recipe, specs in versions.specs.items():
        statuses = {
            name: _status(spec, hw, versions, installed or {}, system_binary, release_base)
            for name, spec in specs.items()
        }
        result[recipe] = RecipeSupport(recipe, default_backend(statuses), statuses)
    return result
