"""Recipes, backends and their pinned releases, parsed from ``backend_versions.json``.

The file is data so that a pin bump or a new asset name never needs a code change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from app.core.errors import ConfigError
from app.core.names import file_name_problem

GITHUB = "https://github.com"
GITHUB_API = "https://api.github.com"
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def release_asset_digest(release: Any, asset: str) -> str | None:
    """The SHA-256 (hex) GitHub's release JSON gives ``asset`` (``"digest": "sha256:..."``), or None."""
    assets = release.get("assets") if isinstance(release, dict) else None
    for entry in assets if isinstance(assets, list) else []:
        if isinstance(entry, dict) and entry.get("name") == asset:
            algorithm, _, value = str(entry.get("digest") or "").partition(":")
            value = value.lower()
            return value if algorithm == "sha256" and SHA256_HEX.fullmatch(value) else None
    return None


RECIPES = ("llamacpp", "lemon-mlx")
# Lemonade's recipe option keys are "<prefix>_backend" and "<prefix>_args" (with "ctx_size" for all).
OPTION_PREFIX = {"llamacpp": "llamacpp", "lemon-mlx": "lemon_mlx"}

# Preference order for the default backend, best first.
PREFERENCE = ("metal", "cuda", "rocm", "vulkan", "cpu", "mlx-lm", "system")


class BackendKind(Enum):
    RELEASE = "release"  # an archive from a GitHub release, unpacked under the app's engines folder
    PIP = "pip"  # packages from the package index in a virtual environment the app manages
    SYSTEM = "system"  # a binary the user already has


class BackendState(Enum):
    INSTALLED = "installed"  # present and at the pinned version
    INSTALLABLE = "installable"  # runs here, not installed yet
    UPDATE_REQUIRED = "update_required"  # installed, but its version differs from the pin
    UNSUPPORTED = "unsupported"  # cannot run here; the message says why


@dataclass(frozen=True)
class BackendKey:
    """A backend of a recipe, such as ``llamacpp:cpu``; ``str()`` gives that text and ``parse`` reads it."""

    recipe: str
    backend: str

    def __str__(self) -> str:
        return f"{self.recipe}:{self.backend}"

    @classmethod
    def parse(cls, text: str) -> BackendKey:
        recipe, colon, backend = text.partition(":")
        if not colon or not recipe or not backend:
            raise ConfigError(
                f"{text!r} does not name a backend.", "Write RECIPE:BACKEND, e.g. llamacpp:cpu."
            )
        return cls(recipe, backend)


@dataclass(frozen=True)
class AssetRule:
    platform: str  # "linux-x86_64", "macos-arm64", ...
    name: str  # template: {version} {build} {channel} {gfx_family} {cuda_arch} and the spec's vars
    min_build: int | None = None
    max_build: int | None = None

    def matches(self, platform: str, build: int | None) -> bool:
        if platform != self.platform:
            return False
        if build is None:
            return self.min_build is None and self.max_build is None
        return (self.min_build is None or build >= self.min_build) and (
            self.max_build is None or build <= self.max_build
        )


@dataclass(frozen=True)
class BackendSpec:
    recipe: str
    name: str
    kind: BackendKind
    version: str = ""
    repo: str = ""
    assets: tuple[AssetRule, ...] = ()
    vars: dict[str, str] = field(default_factory=dict)
    sha256: dict[str, str] = field(default_factory=dict)
    platforms: tuple[str, ...] = ()  # PIP: where its wheels exist
    packages: dict[str, tuple[str, ...]] = field(default_factory=dict)  # PIP: os -> requirements
    binary: str = ""  # SYSTEM: the executable to look for

    @property
    def key(self) -> BackendKey:
        return BackendKey(self.recipe, self.name)

    @property
    def build(self) -> int | None:
        """The build number in a tag such as ``b1045-stable`` or ``b10375``."""
        match = re.match(r"b(\d+)", self.version)
        return int(match.group(1)) if match else None

    @property
    def channel(self) -> str:
        return "preview" if self.version.endswith("-preview") else "stable"

    def asset_rule(self, platform: str) -> AssetRule | None:
        return next((r for r in self.assets if r.matches(platform, self.build)), None)

    def asset_name(self, platform: str, **values: str) -> str | None:
        """The release file for this platform, or None when the release has none."""
        rule = self.asset_rule(platform)
        if rule is None:
            return None
        fields = {"version": self.version, "build": str(self.build), "channel": self.channel, **self.vars}
        fields.update(values)
        try:
            name = rule.name.format(**fields)
        except KeyError as missing:
            raise ConfigError(
                f"Backend versions: asset name for {self.key} needs {missing}, which is not known here."
            ) from None
        # The values come from the versions file and the hardware (a gfx target, say), and the name
        # becomes a file in the staging folder and part of the download URL.
        if why := file_name_problem(name):
            raise ConfigError(f"Backend versions: the asset name {name!r} for {self.key} {why}.")
        return name

    def asset_url(self, asset: str, release_base: str = GITHUB) -> str:
        return f"{release_base.rstrip('/')}/{self.repo}/releases/download/{self.version}/{asset}"

    def release_api_url(self, asset_url: str) -> str:
        """GitHub's REST API for this release, which gives each asset's SHA-256 (``digest``).

        With a release mirror (an asset URL not on github.com) the mirror stands in for the API host
        too, as GitHub Enterprise lays it out: ``{mirror}/api/v3/repos/{repo}/releases/tags/{tag}``.
        """
        tail = f"/repos/{self.repo}/releases/tags/{self.version}"
        base = asset_url.split(f"/{self.repo}/releases/download/", 1)[0]
        if base.rstrip("/") == GITHUB:
            return f"{GITHUB_API}{tail}"
        return f"{base.rstrip('/')}/api/v3{tail}"


@dataclass(frozen=True)
class BackendVersions:
    specs: dict[str, dict[str, BackendSpec]]  # recipe -> backend -> spec
    rocm_families: dict[str, tuple[str, ...]]  # family -> gfx targets

    def spec(self, recipe: str, backend: str) -> BackendSpec:
        try:
            return self.specs[recipe][backend]
        except KeyError:
            known = ", ".join(str(BackendKey(r, b)) for r, bs in self.specs.items() for b in bs)
            raise ConfigError(
                f"Unknown backend '{BackendKey(recipe, backend)}'.", f"Known backends: {known}."
            ) from None

    def gfx_family(self, gfx: str) -> str | None:
        return next((fam for fam, targets in self.rocm_families.items() if gfx in targets), None)


_REQUIRED = object()


def _field(
    obj: Any, key: str, where: str, kind: type | tuple[type, ...] = str, default: Any = _REQUIRED
) -> Any:
    """``obj[key]``, of type ``kind`` (never a bool); ``default`` when absent, else absent is an error."""
    if not isinstance(obj, dict):
        raise ConfigError(f"{where} must be an object")
    if key not in obj:
        if default is _REQUIRED:
            raise ConfigError(f"{where} has no '{key}'")
        return default
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ConfigError(f"'{key}' in {where} has the wrong type")
    return value


def _strings(values: Any, where: str) -> tuple[str, ...]:
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ConfigError(f"{where} must be a list of strings")
    return tuple(values)


def _parse_spec(recipe: str, name: str, raw: Any) -> BackendSpec:
    where = str(BackendKey(recipe, name))
    try:
        kind = BackendKind(_field(raw, "kind", where, default="release"))
    except ValueError:
        raise ConfigError(f"{where} has an unknown kind {raw.get('kind')!r}") from None
    if kind is BackendKind.SYSTEM:
        return BackendSpec(recipe, name, kind, binary=_field(raw, "binary", where))
    version = _field(raw, "version", where)
    if kind is BackendKind.PIP:
        packages = _field(raw, "packages", where, dict)
        return BackendSpec(
            recipe,
            name,
            kind,
            version=version,
            platforms=_strings(_field(raw, "platforms", where, list), f"{where}'s platforms"),
            packages={
                os_name: _strings(reqs, f"{where}'s {os_name} packages") for os_name, reqs in packages.items()
            },
        )
    build = (int, type(None))
    assets = tuple(
        AssetRule(
            platform=_field(a, "platform", f"{where} asset {i}"),
            name=_field(a, "name", f"{where} asset {i}"),
            min_build=_field(a, "min_build", f"{where} asset {i}", build, None),
            max_build=_field(a, "max_build", f"{where} asset {i}", build, None),
        )
        for i, a in enumerate(_field(raw, "assets", where, list))
    )
    return BackendSpec(
        recipe,
        name,
        kind,
        version=version,
        repo=_field(raw, "repo", where),
        assets=assets,
        vars={k: str(v) for k, v in _field(raw, "vars", where, dict, {}).items()},
        sha256={k: str(v).lower() for k, v in _field(raw, "sha256", where, dict, {}).items()},
    )


def parse_backend_versions(data: Any) -> BackendVersions:
    """The pins from ``backend_versions.json``'s JSON; a ConfigError saying what in it is wrong (the
    caller names the file)."""
    recipes = _field(data, "recipes", "the file", dict)
    specs = {
        recipe: {
            name: _parse_spec(recipe, name, raw)
            for name, raw in _field(recipes, recipe, "recipes", dict).items()
        }
        for recipe in recipes
    }
    families = {
        family: _strings(targets, f"ROCm family {family}")
        for family, targets in _field(data, "rocm_families", "the file", dict, {}).items()
    }
    return BackendVersions(specs, families)
