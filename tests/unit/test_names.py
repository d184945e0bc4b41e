"""Names from the network are checked before they become paths, and the cache refuses to write outside
its folder even when a bad name gets past the checks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.core.backends import AssetRule, BackendKind, BackendSpec
from app.core.errors import ConfigError, ModelError, UnsafePathError
from app.core.names import check_listing, file_name_problem, listing_problem, path_problem, repo_id_problem
from app.core.refs import RepoFile, RepoListing
from app.store.hfcache import RepoCache

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SHA256 = "ab" * 32


@pytest.mark.parametrize(
    "path", ["model.gguf", "Q4_K_M/Big-Q4_K_M-00001-of-00003.gguf", ".gitattributes", "a..b/c.d", "é/ü.json"]
)
def test_plain_relative_paths_are_safe(path: str) -> None:
    assert path_problem(path) is None


@pytest.mark.parametrize(
    "path,why",
    [
        ("", "empty"),
        ("../x.gguf", "'..'"),
        ("a/../../x.gguf", "'..'"),
        ("a/./x.gguf", "'.'"),
        ("..", "'..'"),
        ("/etc/passwd", "absolute"),
        ("a//x.gguf", "empty segment"),
        ("a/", "empty segment"),
        ("..\\x.gguf", "backslash"),
        ("C:\\x.gguf", "backslash"),
        ("x\x00.gguf", "control"),
        ("x\n.gguf", "control"),
    ],
)
def test_unsafe_paths_say_why(path: str, why: str) -> None:
    problem = path_problem(path)
    assert problem is not None and why in problem


def test_not_text_is_not_a_path() -> None:
    assert path_problem(None) is not None and path_problem(42) is not None


def test_asset_names_are_single_file_names() -> None:
    assert file_name_problem("llama-b1-bin-ubuntu-x64.zip") is None
    assert file_name_problem("dir/llama.zip") == "is a path, not a file name"
    assert file_name_problem("..") is not None


def test_repo_ids() -> None:
    assert repo_id_problem("unsloth/Qwen3-0.6B-GGUF") is None
    for bad in ("../x", "a/b/c", "a/..", "org/repo:Q4_0", "", None):
        assert repo_id_problem(bad) is not None


def listing(revision: str = COMMIT, **file: object) -> RepoListing:
    fields: dict[str, object] = {"path": "x-Q4_0.gguf", "size": 1, "sha256": SHA256, "blob_id": COMMIT}
    fields.update(file)
    return RepoListing("org/repo", revision, (RepoFile(**fields),))  # type: ignore[arg-type]


def test_a_listing_with_hub_shaped_names_is_safe() -> None:
    assert listing_problem(listing()) is None
    assert listing_problem(listing(sha256=None)) is None  # a small file outside LFS
    assert check_listing(listing()) == listing()


@pytest.mark.parametrize(
    "bad,found",
    [
        ({"revision": "../../x"}, "the revision '../../x' is not a commit id"),
        ({"revision": "main"}, "is not a commit id"),
        ({"revision": COMMIT.upper()}, "is not a commit id"),
        ({"path": "../x.gguf"}, "the file name '../x.gguf' has a '..'"),
        ({"sha256": "../../" + SHA256}, "is not a SHA-256"),
        ({"sha256": SHA256[:-1]}, "is not a SHA-256"),
        ({"blob_id": "../x"}, "is not a git blob id"),
        ({"blob_id": 7}, "is not a git blob id"),
    ],
)
def test_a_listing_with_a_bad_name_is_refused_with_what_to_do(bad: dict[str, object], found: str) -> None:
    with pytest.raises(ModelError) as err:
        check_listing(listing(**bad))
    message = str(err.value)
    assert message.startswith("The Hub's file list for org/repo is not safe to use:") and found in message
    assert "Nothing was downloaded" in message and "check HF_ENDPOINT" in err.value.hint


def test_a_hostile_asset_name_is_refused() -> None:
    spec = BackendSpec(
        "llamacpp",
        "rocm",
        BackendKind.RELEASE,
        version="b1",
        repo="o/r",
        assets=(AssetRule("linux-x86_64", "llama-{version}-{gfx_family}.zip"),),
    )
    assert spec.asset_name("linux-x86_64", gfx_family="gfx110X") == "llama-b1-gfx110X.zip"
    with pytest.raises(ConfigError, match="is a path, not a file name"):
        spec.asset_name("linux-x86_64", gfx_family="/../../../evil")


def test_the_cache_refuses_paths_outside_the_repo_folder(tmp_path: Path) -> None:
    """The last guard, for a name that got past the checks (here: built without them)."""
    cache = RepoCache(tmp_path / "hub", "org/repo")
    with pytest.raises(UnsafePathError, match="outside"):
        cache.blob("../../../evil")
    with pytest.raises(UnsafePathError):
        cache.snapshot("../../evil")
    with pytest.raises(UnsafePathError):
        cache.link(COMMIT, RepoFile("../../../../evil.gguf", 1, sha256=SHA256))
    with pytest.raises(UnsafePathError):
        cache.link(COMMIT, RepoFile(str(tmp_path / "evil.gguf"), 1, sha256=SHA256))
    # A folder inside a snapshot that is a symlink to elsewhere leads outside too.
    snapshot = cache.snapshot(COMMIT)
    snapshot.mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", snapshot / "sub")
    with pytest.raises(UnsafePathError):
        cache.link(COMMIT, RepoFile("sub/x.gguf", 1, sha256=SHA256))
    assert list((tmp_path / "elsewhere").iterdir()) == []
    assert {p.name for p in tmp_path.iterdir()} <= {"elsewhere", "hub", "lemon-home"}
    assert cache.link(COMMIT, RepoFile("ok/x.gguf", 1, sha256=SHA256)).is_symlink()
