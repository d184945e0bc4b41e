"""Unpacking release archives: real layouts keep their links and modes; hostile ones are refused whole."""

from __future__ import annotations

import io
import stat
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest

from app.core.errors import InstallError, UnsafePathError
from app.supervisor import archive
from app.supervisor.archive import Cancelled, find_binary, unpack

ELF = b"\x7fELF fake binary bytes"


def add_file(tar: tarfile.TarFile, name: str, data: bytes = b"x", mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def add_link(tar: tarfile.TarFile, name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    tar.addfile(info)


def make_tar(path: Path, build: object, mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tar:
        build(tar)  # type: ignore[operator]
    return path


def release_layout(tar: tarfile.TarFile) -> None:
    """Like llama.cpp's Linux assets: one top folder, binaries, versioned libraries and their links."""
    top = tarfile.TarInfo("llama-b10375")
    top.type, top.mode = tarfile.DIRTYPE, 0o755
    tar.addfile(top)
    add_file(tar, "llama-b10375/llama-server", ELF, 0o755)
    add_file(tar, "llama-b10375/libllama.so.0.6.0", b"lib", 0o755)
    add_link(tar, "llama-b10375/libllama.so.0", "libllama.so.0.6.0")
    add_link(tar, "llama-b10375/libllama.so", "libllama.so.0")
    add_file(tar, "llama-b10375/LICENSE", b"MIT", 0o6775)  # set-id and group write are dropped


@pytest.mark.parametrize("suffix,mode", [(".tar.gz", "w:gz"), (".tar.xz", "w:xz")])
def test_release_tarball_unpacks_with_links_and_modes(tmp_path: Path, suffix: str, mode: str) -> None:
    archive = make_tar(tmp_path / f"llama{suffix}", release_layout, mode)
    dest = tmp_path / "out"
    unpack(archive, dest)
    binary = find_binary(dest, "llama-server")
    assert binary == dest / "llama-b10375" / "llama-server"
    assert binary.read_bytes() == ELF and binary.stat().st_mode & 0o111 == 0o111
    lib = dest / "llama-b10375" / "libllama.so"
    assert lib.is_symlink() and lib.read_bytes() == b"lib"
    assert stat.S_IMODE((dest / "llama-b10375" / "LICENSE").stat().st_mode) == 0o755


def zip_add(zf: zipfile.ZipFile, name: str, data: bytes, mode: int) -> None:
    info = zipfile.ZipInfo(name)
    info.external_attr = mode << 16
    zf.writestr(info, data)


def test_zip_keeps_executable_bits_and_symlinks(tmp_path: Path) -> None:
    archive = tmp_path / "mlx-engine.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zip_add(zf, "server", ELF, stat.S_IFREG | 0o755)
        zip_add(zf, "libopenblas.so.0.3", b"blas", stat.S_IFREG | 0o644)
        zip_add(zf, "libopenblas.so.0", b"libopenblas.so.0.3", stat.S_IFLNK | 0o777)
        windows = zipfile.ZipInfo("README.txt")
        windows.create_system, windows.external_attr = 0, 0x20  # MS-DOS "archive" attribute, no Unix mode
        zf.writestr(windows, "made on Windows")
    dest = tmp_path / "out"
    unpack(archive, dest)
    assert (dest / "server").stat().st_mode & 0o100
    assert not (dest / "libopenblas.so.0.3").stat().st_mode & 0o111
    assert (dest / "libopenblas.so.0").is_symlink() and (dest / "libopenblas.so.0").read_bytes() == b"blas"
    assert stat.S_IMODE((dest / "README.txt").stat().st_mode) == 0o644


def test_binary_under_build_bin_is_found(tmp_path: Path) -> None:
    archive = tmp_path / "old-layout.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zip_add(zf, "build/bin/llama-server", ELF, stat.S_IFREG | 0o755)
        zip_add(zf, "build/bin/extra/llama-server", ELF, stat.S_IFREG | 0o755)
    unpack(archive, tmp_path / "out")
    assert (
        find_binary(tmp_path / "out", "llama-server") == tmp_path / "out" / "build" / "bin" / "llama-server"
    )
    assert find_binary(tmp_path / "out", "server") is None


HOSTILE_TARS = {
    "dot-dot": lambda t: add_file(t, "llama/../../evil.sh"),
    "absolute": lambda t: add_file(t, "/tmp/evil.sh"),
    "symlink-up": lambda t: add_link(t, "llama/lib", "../../outside"),
    "symlink-absolute": lambda t: add_link(t, "llama/passwd", "/etc/passwd"),
    "through-symlink": lambda t: (add_link(t, "d", "."), add_file(t, "d/x")),
    "hardlink-up": lambda t: add_link(t, "llama/h", "../../etc/shadow", tarfile.LNKTYPE),
    "device": lambda t: add_link(t, "llama/null", "", tarfile.CHRTYPE),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_TARS))
def test_hostile_tar_is_refused_before_anything_is_written(tmp_path: Path, case: str) -> None:
    def build(tar: tarfile.TarFile) -> None:
        add_file(tar, "llama/llama-server", ELF, 0o755)  # a good member first: it must not be written
        HOSTILE_TARS[case](tar)

    archive = make_tar(tmp_path / "evil.tar.gz", build)
    dest = tmp_path / "deep" / "out"
    with pytest.raises(InstallError, match="is unsafe") as err:
        unpack(archive, dest)
    assert "Nothing was installed" in str(err.value)
    assert list(dest.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep", "evil.tar.gz"]


@pytest.mark.parametrize(
    "name,data,mode",
    [
        ("../evil.sh", b"x", stat.S_IFREG | 0o755),
        ("/abs/evil.sh", b"x", stat.S_IFREG | 0o755),
        ("C:/evil.sh", b"x", stat.S_IFREG | 0o755),
        ("..\\..\\evil.sh", b"x", stat.S_IFREG | 0o755),
        ("link", b"../../outside", stat.S_IFLNK | 0o777),
    ],
)
def test_hostile_zip_is_refused(tmp_path: Path, name: str, data: bytes, mode: int) -> None:
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zip_add(zf, "server", ELF, stat.S_IFREG | 0o755)
        zip_add(zf, name, data, mode)
    with pytest.raises(InstallError, match="is unsafe"):
        unpack(archive, tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize(
    "target,why",
    [(b"\xff\xfe", "is not UTF-8 text"), (b"lib\x00.so", "holds a NUL byte")],
)
def test_zip_symlink_whose_target_is_no_path_is_refused(tmp_path: Path, target: bytes, why: str) -> None:
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zip_add(zf, "server", ELF, stat.S_IFREG | 0o755)
        zip_add(zf, "link", target, stat.S_IFLNK | 0o777)
    with pytest.raises(InstallError, match=f"'link' is a symlink whose target {why}"):
        unpack(archive, tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []


def patched_zip(path: Path, local: dict[int, int], central: dict[int, int]) -> Path:
    """A one-member zip with header fields overwritten: {offset: 16-bit value} in each header."""
    with zipfile.ZipFile(path, "w") as zf:
        zip_add(zf, "llama-server", ELF, stat.S_IFREG | 0o755)
    data = bytearray(path.read_bytes())
    cd = data.find(b"PK\x01\x02")
    for base, fields in ((0, local), (cd, central)):
        for offset, value in fields.items():
            data[base + offset : base + offset + 2] = value.to_bytes(2, "little")
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "local,central,why",
    [
        ({8: 99}, {10: 99}, "compression method is not supported"),  # method 99: not one zipfile knows
        ({6: 1}, {8: 1}, "is encrypted"),  # general purpose flag bit 0: encrypted
    ],
)
def test_zip_member_zipfile_cannot_read_is_damaged(
    tmp_path: Path, local: dict[int, int], central: dict[int, int], why: str
) -> None:
    archive = patched_zip(tmp_path / "odd.zip", local, central)
    with pytest.raises(InstallError, match=f"odd.zip is damaged and cannot be unpacked .*{why}"):
        unpack(archive, tmp_path / "out")


def test_the_last_guard_holds_when_the_member_checks_are_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each path the unzip writes is checked to be inside the folder, symlinked parents resolved."""
    monkeypatch.setattr(archive, "check_entries", lambda *_: None)  # as if a check had a hole
    outside = tmp_path / "outside"
    outside.mkdir()
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as zf:
        zip_add(zf, "d", str(outside).encode(), stat.S_IFLNK | 0o777)
        zip_add(zf, "d/evil.sh", b"x", stat.S_IFREG | 0o755)
    with pytest.raises(UnsafePathError, match="outside"):
        unpack(evil, tmp_path / "out")
    assert list(outside.iterdir()) == []


def test_truncated_archive_is_damaged(tmp_path: Path) -> None:
    good = make_tar(tmp_path / "good.tar.gz", release_layout)
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(InstallError, match=r"cut.tar.gz is damaged"):
        unpack(cut, tmp_path / "out")
    bad_zip = tmp_path / "cut.zip"
    bad_zip.write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(InstallError, match=r"cut.zip is damaged"):
        unpack(bad_zip, tmp_path / "out2")


def test_unknown_archive_type(tmp_path: Path) -> None:
    (tmp_path / "x.rar").write_bytes(b"Rar!")
    with pytest.raises(InstallError, match=r"is not a zip, tar\.gz or tar\.xz archive"):
        unpack(tmp_path / "x.rar", tmp_path / "out")


def test_cancel_stops_between_members(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "a.tar.gz", release_layout)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        unpack(archive, tmp_path / "out", cancel)
    assert list((tmp_path / "out").iterdir()) == []
