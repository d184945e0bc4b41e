"""The Hugging Face cache layout, shared with ``huggingface_hub``, lemon-mlx and other tools.

    <cache>/models--org--repo/
        blobs/<sha256 or git blob id>            the bytes, once per content
        snapshots/<commit>/<path in repo>        relative symlinks into ../blobs
        refs/main                                the commit "main" pointed at when we fetched

``<cache>`` is the ``models_dir`` setting, else ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``$XDG_CACHE_HOME/huggingface/hub`` or ``~/.cache/huggingface/hub``, the way ``huggingface_hub`` picks it.

Commits, blob ids and file paths come from the Hub and are checked where they enter
(``app.core.names``); every path written or removed here is checked once more to be inside the repo's
folder (``inside``), so a name that slipped past still cannot leave it.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from app.core.refs import RepoFile, RepoListing
from app.store.files import atomic_write_bytes, inside

_COMMIT = re.compile(r"[0-9a-f]{40}")  # what huggingface_hub writes into refs/<name>


def hub_cache_dir(models_dir: str = "") -> Path:
    if models_dir:
        return Path(models_dir).expanduser()
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def repo_folder_name(repo_id: str) -> str:
    return "models--" + repo_id.replace("/", "--")


class RepoCache:
    """One repo's folder in the cache."""

    def __init__(self, root: Path, repo_id: str) -> None:
        self.root = root
        self.repo_id = repo_id
        self.folder = root / repo_folder_name(repo_id)

    def blob(self, oid: str) -> Path:
        return inside(self.folder, self.folder / "blobs" / oid)

    def snapshot(self, revision: str) -> Path:
        return inside(self.folder, self.folder / "snapshots" / revision)

    def ref(self, name: str = "main") -> str | None:
        """The commit ``refs/<name>`` names, or None. The file is shared with other tools and may be
        damaged: one that is not text (a ValueError) or names no commit counts as missing."""
        try:
            commit = (self.folder / "refs" / name).read_text().strip()
        except (OSError, ValueError):
            return None
        return commit if _COMMIT.fullmatch(commit) else None

    def set_ref(self, revision: str, name: str = "main") -> None:
        atomic_write_bytes(self.folder / "refs" / name, revision.encode())

    def has_blob(self, file: RepoFile) -> bool:
        """The content is here already (we or another tool fetched and verified it)."""
        try:
            return self.blob(file.oid).stat().st_size == file.size
        except OSError:
            return False

    def link(self, revision: str, file: RepoFile) -> Path:
        """Point ``snapshots/<revision>/<path>`` at its blob with a relative symlink (replacing one)."""
        dest = inside(self.folder, self.snapshot(revision) / file.path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        target = os.path.relpath(self.blob(file.oid), dest.parent)
        tmp = dest.with_name(f".{dest.name}.link")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target)
        os.replace(tmp, dest)
        return dest

    def _snapshots(self) -> list[Path]:
        """Every snapshot folder, ``refs/main``'s first."""
        folder = self.folder / "snapshots"
        found = sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
        main = self.ref()
        return sorted(found, key=lambda p: p.name != main)

    def find(self, path: str) -> Path | None:
        """Where a repo file is in the cache, newest snapshot (``refs/main``) first."""
        for snap in self._snapshots():
            if (snap / path).exists():
                return snap / path
        return None

    def local_listing(self) -> RepoListing | None:
        """Every complete file the cache holds for this repo, across snapshots (``refs/main``'s win)."""
        snapshots = self._snapshots()
        if not snapshots:
            return None
        files: dict[str, RepoFile] = {}
        for base in snapshots:
            for path in sorted(base.rglob("*")):
                rel = path.relative_to(base).as_posix()
                if rel in files or path.name.startswith(".") or path.is_dir() or not path.exists():
                    continue
                oid = path.resolve().name if path.is_symlink() else ""
                files[rel] = RepoFile(
                    rel,
                    path.stat().st_size,
                    sha256=oid if len(oid) == 64 else None,
                    blob_id=oid if len(oid) == 40 else None,
                )
        return RepoListing(self.repo_id, self.ref() or snapshots[0].name, tuple(files.values()))

    def bytes_on_disk(self, files: tuple[RepoFile, ...]) -> int:
        """How much of ``files`` is here: whole blobs plus partial ones."""
        return sum(f.size for f in files if self.has_blob(f)) + self.partial_bytes(files)

    def partial_bytes(self, files: tuple[RepoFile, ...]) -> int:
        """Bytes already in ``blobs/<oid>.part`` files (an interrupted download's progress)."""
        total = 0
        for f in files:
            part = self.blob(f.oid + ".part")
            total += part.stat().st_size if part.exists() else 0
        return total

    def remove_partials(self, files: tuple[RepoFile, ...]) -> None:
        for f in files:
            self.blob(f.oid + ".part").unlink(missing_ok=True)

    def remove(self, paths: set[str], keep: set[str]) -> int:
        """Unlink ``paths`` (less ``keep``) from every snapshot, then delete blobs nothing links to.

        Returns the bytes freed. The repo folder goes when no snapshot holds anything any more.
        """
        snapshots = self.folder / "snapshots"
        for snap in snapshots.iterdir() if snapshots.is_dir() else []:
            for path in paths - keep:
                inside(self.folder, snap / path).unlink(missing_ok=True)
            _prune_empty_dirs(snap)
        linked = (
            {p.resolve().name for p in snapshots.rglob("*") if p.is_symlink()}
            if snapshots.is_dir()
            else set()
        )
        freed = 0
        blobs = self.folder / "blobs"
        partials = False
        for blob in blobs.iterdir() if blobs.is_dir() else []:
            if blob.name.endswith(".part"):
                partials = True  # another download of this repo is under way or paused
            elif blob.name not in linked:
                freed += blob.stat().st_size
                blob.unlink()
        if not linked and not partials:
            shutil.rmtree(self.folder, ignore_errors=True)
        return freed


def _prune_empty_dirs(top: Path) -> None:
    for folder in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()
    if top.is_dir() and not any(top.iterdir()):
        top.rmdir()
