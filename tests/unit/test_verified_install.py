"""Verified engine installs: the asset's SHA-256 from the release metadata (GitHub's REST API, stood in
for by the loopback release mirror at ``{mirror}/api/v3/repos/{repo}/releases/tags/{tag}``) or from a
pin; a mismatch is refused with nothing installed; an install with no digest anywhere is shown as
unverified. The archive holds a placeholder ``llama-server`` (these tests install, they never run it)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from app.core.backends import BackendKind, BackendSpec, release_asset_digest
from app.store.installs import install_dir, read_manifest
from app.store.paths import resource, staging_dir
from tests.conftest import profile_path
from tests.support.fileserver import Served, serve

TAG = "b10375"
ASSET = f"llama-{TAG}-bin-ubuntu-x64.tar.gz"
REPO = "ggml-org/llama.cpp"
API = f"/api/v3/repos/{REPO}/releases/tags/{TAG}"


def archive() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        body = b"#!/bin/sh\necho placeholder\n"
        info = tarfile.TarInfo(f"llama-{TAG}/llama-server")
        info.size, info.mode = len(body), 0o755
        tar.addfile(info, io.BytesIO(body))
    return out.getvalue()


TARBALL = archive()
GOOD = hashlib.sha256(TARBALL).hexdigest()


class Mirror:
    def __init__(self, served: Served, versions: Path) -> None:
        self.served, self.versions = served, versions
        served.files[f"/{REPO}/releases/download/{TAG}/{ASSET}"] = TARBALL

    def pin(self, digest: str | None) -> None:
        data = json.loads(resource("backend_versions.json").read_text())
        cpu = data["recipes"]["llamacpp"]["cpu"]
        cpu["version"], cpu["sha256"] = TAG, ({ASSET: digest} if digest else {})
        self.versions.write_text(json.dumps(data))

    def release(self, digest: str | None) -> None:
        """GitHub's release JSON for the tag; ``None``: the API answers 404."""
        if digest is None:
            self.served.files.pop(API, None)
            return
        assets = [{"name": ASSET, "digest": f"sha256:{digest}", "size": len(TARBALL)}, {"name": "x.zip"}]
        self.served.files[API] = json.dumps({"tag_name": TAG, "assets": assets}).encode()


@pytest.fixture
def mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Mirror]:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))
    versions = tmp_path / "backend_versions.json"
    monkeypatch.setenv("LEMON_DESK_BACKEND_VERSIONS", str(versions))
    served = Served()
    with serve(served) as base:
        monkeypatch.setenv("LEMON_DESK_RELEASE_MIRROR", base)
        yield Mirror(served, versions)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def cpu_status(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, err = cli(capsys, "backends", "--json")
    assert code == 0, err
    return dict(json.loads(out)["recipes"]["llamacpp"]["backends"]["cpu"])


def assert_nothing_installed() -> None:
    assert read_manifest(install_dir("llamacpp", "cpu")) is None
    assert not staging_dir().exists()


def test_the_release_digest_refuses_a_mismatch_and_accepts_a_match(
    mirror: Mirror, capsys: pytest.CaptureFixture[str]
) -> None:
    mirror.pin(None)
    mirror.release("0" * 64)
    code, _, err = cli(capsys, "backends", "install", "llamacpp:cpu")
    assert code == 1 and f"{ASSET} is corrupt: its SHA-256 is {GOOD}, expected {'0' * 64}" in err
    assert_nothing_installed()
    assert API in [p for p, _ in mirror.served.log]  # asked the (stand-in) release API

    mirror.release(GOOD)
    code, _, err = cli(capsys, "backends", "install", "llamacpp:cpu")
    assert code == 0, err
    manifest = read_manifest(install_dir("llamacpp", "cpu"))
    assert manifest is not None and (manifest.sha256, manifest.verified_by) == (GOOD, "release")
    assert cpu_status(capsys)["digest"] == "release"


def test_a_pin_is_checked_and_must_agree_with_the_release(
    mirror: Mirror, capsys: pytest.CaptureFixture[str]
) -> None:
    mirror.pin("f" * 64)
    mirror.release(GOOD)
    code, _, err = cli(capsys, "backends", "install", "llamacpp:cpu")
    assert code == 1 and "is not the one its release gives" in err
    assert_nothing_installed()

    mirror.pin("f" * 64)
    mirror.release(None)  # no release metadata: the pin alone decides
    code, _, err = cli(capsys, "backends", "install", "llamacpp:cpu")
    assert code == 1 and "is corrupt" in err
    assert_nothing_installed()

    mirror.pin(GOOD)
    assert cpu_status(capsys)["digest"] == "pin"  # before the install, from the pin
    code, _, err = cli(capsys, "backends", "install", "llamacpp:cpu")
    assert code == 0, err
    assert read_manifest(install_dir("llamacpp", "cpu")).verified_by == "pin"  # type: ignore[union-attr]


def test_no_digest_anywhere_installs_and_says_unverified(
    mirror: Mirror, capsys: pytest.CaptureFixture[str]
) -> None:
    mirror.pin(None)
    mirror.release(None)
    assert "digest" not in cpu_status(capsys)  # not known until the release API is asked
    code, _, err = cli(capsys, "backends", "install", "llamacpp:cpu")
    assert code == 0, err
    assert cpu_status(capsys)["digest"] == "unverified"
    code, out, _ = cli(capsys, "backends")
    assert code == 0 and "unverified" in out
    code, out, _ = cli(capsys, "system-info", "--json")
    assert json.loads(out)["recipes"]["llamacpp"]["backends"]["cpu"]["digest"] == "unverified"
    code, out, _ = cli(capsys, "system-info")
    assert "unverified" in out


def test_release_urls_and_digests() -> None:
    spec = BackendSpec("llamacpp", "cpu", BackendKind.RELEASE, version=TAG, repo=REPO)
    github = spec.asset_url(ASSET)
    assert spec.release_api_url(github) == f"https://api.github.com/repos/{REPO}/releases/tags/{TAG}"
    assert spec.release_api_url(spec.asset_url(ASSET, "http://mirror:8/gh/")) == f"http://mirror:8/gh{API}"
    release = {"assets": [{"name": ASSET, "digest": f"sha256:{GOOD.upper()}"}]}
    assert release_asset_digest(release, ASSET) == GOOD
    for bad in ({"assets": [{"name": ASSET, "digest": "md5:abc"}]}, {"assets": [{"name": ASSET}]}, [], {}):
        assert release_asset_digest(bad, ASSET) is None
    assert release_asset_digest({"assets": [{"name": ASSET, "digest": "sha256:../x"}]}, ASSET) is None
