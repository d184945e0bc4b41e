"""Installing lemon-mlx release builds from a loopback mirror on FAKE hardware profiles (this machine has
no Strix Halo, no Apple GPU): the asset named for the pinned tag under both naming schemes, unpacked with
``server`` found; and a refusal before any download where no build exists."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cli import main
from app.store.installs import install_dir, read_manifest
from app.store.paths import resource
from tests.conftest import profile_path
from tests.support.fileserver import Served, serve
from tests.support.lemon_mlx_release import release_zip

pytestmark = pytest.mark.integration

RELEASES = "/lemonade-sdk/lemon-mlx-engine/releases/download"


@pytest.fixture
def releases(monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    """Every lemon-mlx asset name the tests ask for, each a zip in the release layout (its ``server`` a
    STAND-IN that is never run here)."""
    served = Served()
    with serve(served) as base:
        monkeypatch.setenv("LEMON_DESK_RELEASE_MIRROR", base)
        yield served


def pin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, backend: str, tag: str) -> None:
    versions = json.loads(resource("backend_versions.json").read_text())
    versions["recipes"]["lemon-mlx"][backend]["version"] = tag
    path = tmp_path / "backend_versions.json"
    path.write_text(json.dumps(versions))
    monkeypatch.setenv("LEMON_DESK_BACKEND_VERSIONS", str(path))


@pytest.mark.parametrize(
    ("tag", "asset"),
    [
        ("b1045-stable", "mlx-engine-b1045-stable-ubuntu-rocm-x64.zip"),
        ("b1033-stable", "mlx-engine-b1033-stable-ubuntu-rocm-stable-gfx1151-x64.zip"),
        ("b1020-preview", "mlx-engine-b1020-preview-ubuntu-rocm-preview-gfx1151-x64.zip"),
    ],
)
def test_rocm_on_strix_halo_fetches_the_asset_for_the_pinned_tag(
    tag: str,
    asset: str,
    releases: Served,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("strix_halo")))
    pin(monkeypatch, tmp_path, "rocm", tag)
    releases.files[f"{RELEASES}/{tag}/{asset}"] = release_zip(Path("/bin/false"))

    assert main(["backends", "install", "lemon-mlx:rocm", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["version"] == tag
    # The release's metadata (for the asset's digest), then the asset, once.
    downloads = [path for path, _ in releases.log if not path.startswith("/api/v3/")]
    assert downloads == [f"{RELEASES}/{tag}/{asset}"]
    folder = install_dir("lemon-mlx", "rocm")
    manifest = read_manifest(folder)
    assert manifest is not None and manifest.asset == asset
    assert (folder / "server").stat().st_mode & 0o111  # found, and executable
    assert (folder / "libopenblas.so.0").exists()


@pytest.mark.parametrize(
    ("profile", "backend", "says"),
    [
        ("linux_arm64", "cpu", "No lemon-mlx build exists for Linux arm64. Use the mlx-lm backend instead."),
        ("intel_mac", "metal", "No lemon-mlx build exists for Intel Macs."),
        ("intel_mac", "cpu", "No lemon-mlx build exists for Intel Macs."),
        ("rdna2", "rocm", "is not supported by ROCm builds"),
    ],
)
def test_no_build_for_the_platform_is_refused_before_any_download(
    profile: str,
    backend: str,
    says: str,
    releases: Served,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path(profile)))
    assert main(["backends", "install", f"lemon-mlx:{backend}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: lemon-mlx:{backend} cannot run on this machine") and says in err
    assert releases.log == []
    assert not install_dir("lemon-mlx", backend).exists()
