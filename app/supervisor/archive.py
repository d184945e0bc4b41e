"""Unpack release archives (.zip, .tar.gz, .tar.xz) safely into an empty folder.

Every member is checked before anything is written: no absolute paths, no ``..``, no symlink whose
target leaves the folder, no member reached through a symlink, no device files. One bad member refuses
the whole archive; each path written is checked once more to be inside the folder. Executable bits
survive (zip included); set-id bits and group/other write do not.
"""

from __future__ import annotations

import lzma
import posixpath
import re
import shutil
import stat
import tarfile
import threading
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from app.core.errors import InstallError
from app.store.files import inside

TAR_SUFFIXES = (".tar.gz", ".tgz", ".tar.xz", ".txz")


class Cancelled(Exception):
    """Unpacking stopped because the install was cancelled."""


@dataclass(frozen=True)
class Entry:
    """One archive member as far as safety is concerned."""

    name: str
    kind: str  # "file", "dir", "symlink", "hardlink", "special"
    link: str = ""  # symlink target, or the archive path a hard link points to


def _unsafe(archive: str, name: str, why: str) -> InstallError:
    return InstallError(
        f"{archive} is unsafe: its member {name!r} {why}. Nothing was installed.",
        "The download may have been tampered with; report it rather than retrying.",
    )


def _relative(name: str) -> str | None:
    """The member's normalised relative path, or None when it is absolute or climbs out with ``..``."""
    path = name.replace("\\", "/")
    if path.startswith("/") or re.match(r"[A-Za-z]:", path):
        return None
    parts = [p for p in path.split("/") if p not in ("", ".")]
    return "/".join(parts) if ".." not in parts else None


def check_entries(archive: str, entries: list[Entry]) -> None:
    """Refuse the archive unless every member lands inside the destination folder."""
    paths: dict[str, Entry] = {}
    for entry in entries:
        rel = _relative(entry.name)
        if rel is None:
            raise _unsafe(archive, entry.name, "would be written outside the install folder")
        if entry.kind == "special":
            raise _unsafe(archive, entry.name, "is a device or pipe")
        if entry.kind == "symlink":
            target = entry.link.replace("\\", "/")
            joined = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
            if target.startswith("/") or joined == ".." or joined.startswith("../"):
                raise _unsafe(archive, entry.name, f"is a symlink pointing outside it ({entry.link})")
        if entry.kind == "hardlink" and _relative(entry.link) is None:
            raise _unsafe(archive, entry.name, f"is a hard link to {entry.link!r} outside it")
        paths[rel] = entry
    symlinks = {rel for rel, e in paths.items() if e.kind == "symlink"}
    for rel in paths:
        parent = posixpath.dirname(rel)
        while parent:
            if parent in symlinks:
                raise _unsafe(archive, rel, f"is reached through the symlink {parent!r}")
            parent = posixpath.dirname(parent)


def _tar_kind(member: tarfile.TarInfo) -> str:
    if member.isdir():
        return "dir"
    if member.issym():
        return "symlink"
    if member.islnk():
        return "hardlink"
    return "file" if member.isreg() else "special"


def _untar(archive: Path, dest: Path, cancel: threading.Event | None) -> None:
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        check_entries(archive.name, [Entry(m.name, _tar_kind(m), m.linkname) for m in members])
        for member in members:
            if cancel is not None and cancel.is_set():
                raise Cancelled
            try:  # the "data" filter is tarfile's own check that each member lands inside ``dest``
                tar.extract(member, dest, filter="data")
            except tarfile.FilterError as err:
                raise _unsafe(archive.name, member.name, str(err)) from None


def _zip_mode(info: zipfile.ZipInfo) -> int:
    return (info.external_attr >> 16) & 0xFFFF


def _zip_kind(info: zipfile.ZipInfo) -> str:
    kind = stat.S_IFMT(_zip_mode(info))
    if info.is_dir() or kind == stat.S_IFDIR:
        return "dir"
    if kind == stat.S_IFLNK:
        return "symlink"
    return "file" if kind in (0, stat.S_IFREG) else "special"


def _file_mode(zip_mode: int) -> int:
    """Permissions for an unpacked file: the archive's, minus set-id and group/other write; owner rw."""
    mode = zip_mode & 0o755
    if not mode:
        return 0o644  # zips made on Windows carry no mode
    if not mode & 0o100:
        mode &= ~0o111
    return mode | 0o600


def _zip_link(archive: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> str:
    """A zip symlink's target (the member's bytes). One that is not UTF-8 or holds a NUL byte is no
    path a release would link to, and os.symlink could not make it anyway: the archive is refused."""
    try:
        link = zf.read(info).decode()
    except UnicodeDecodeError:
        raise _unsafe(archive, info.filename, "is a symlink whose target is not UTF-8 text") from None
    if "\0" in link:
        raise _unsafe(archive, info.filename, "is a symlink whose target holds a NUL byte")
    return link


def _unzip(archive: Path, dest: Path, cancel: threading.Event | None) -> None:
    with zipfile.ZipFile(archive) as zf:
        entries: list[tuple[zipfile.ZipInfo, Entry]] = []
        for info in zf.infolist():
            kind = _zip_kind(info)
            link = _zip_link(archive.name, zf, info) if kind == "symlink" else ""
            entries.append((info, Entry(info.filename, kind, link)))
        check_entries(archive.name, [entry for _, entry in entries])
        for info, entry in entries:
            if cancel is not None and cancel.is_set():
                raise Cancelled
            target = inside(dest, dest / (_relative(info.filename) or "."))
            if entry.kind == "dir":
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if entry.kind == "symlink":
                target.unlink(missing_ok=True)
                target.symlink_to(entry.link)
                continue
            with zf.open(info) as src, target.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            target.chmod(_file_mode(_zip_mode(info)))


def unpack(archive: Path, dest: Path, cancel: threading.Event | None = None) -> None:
    """Unpack ``archive`` into the empty or missing folder ``dest``; InstallError says what was wrong."""
    dest.mkdir(parents=True, exist_ok=True)
    name = archive.name.lower()
    try:
        if name.endswith(".zip"):
            _unzip(archive, dest, cancel)
        elif name.endswith(TAR_SUFFIXES):
            _untar(archive, dest, cancel)
        else:
            raise InstallError(f"{archive.name} is not a zip, tar.gz or tar.xz archive.")
    # zipfile refuses a compression method it does not know with NotImplementedError and an encrypted
    # member with RuntimeError: archives we cannot read, like damaged ones.
    except (
        tarfile.TarError,
        zipfile.BadZipFile,
        EOFError,
        zlib.error,
        lzma.LZMAError,
        NotImplementedError,
        RuntimeError,
    ) as err:
        raise InstallError(
            f"{archive.name} is damaged and cannot be unpacked ({err or type(err).__name__}). "
            "Nothing was installed.",
            "Try the install again; the archive will be downloaded afresh.",
        ) from None


def find_binary(root: Path, name: str) -> Path | None:
    """The engine executable in an unpacked release: at the top, under ``build/bin/`` or a top folder."""
    found = [p for p in root.rglob(name) if p.is_file()]
    return min(found, key=lambda p: (len(p.relative_to(root).parts), str(p))) if found else None


def make_executable(path: Path) -> None:
    """``chmod +x`` for whoever may read it."""
    mode = path.stat().st_mode
    path.chmod(mode | (mode & 0o444) >> 2)
