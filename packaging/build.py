"""Build the Lemon Desk package for the machine this runs on: ``python packaging/build.py``.

Needs ``pip install -e '.[package]'`` (PyInstaller and the pinned ``uv``). Writes:

- ``dist/lemon-desk/``: the unpacked bundle; ``dist/lemon-desk/lemon-desk`` behaves like the
  pip-installed ``lemon-desk`` (window and subcommands);
- Linux: ``dist/lemon-desk-<version>-linux-<arch>.tar.gz`` (the bundle and an INSTALL note);
- macOS: ``dist/Lemon Desk.app`` (ad-hoc signed) and ``dist/lemon-desk-<version>-macos-<arch>.dmg``.

How it is laid out, and why:

- The source is staged under ``build/stage/`` the way a wheel installs it: ``resources/`` becomes
  ``app/resources`` and ``packaging/`` becomes ``app/packaging``, so the code finds its files with
  ``importlib.resources`` exactly as it does when pip-installed. PyInstaller then analyses the staged
  tree, not the editable install (whose import hook PyInstaller does not follow).
- The entry script is a verbatim copy of ``app/__main__.py`` placed beside ``app/`` (not inside it:
  PyInstaller puts the entry script's folder on the import path, and ``app/platform`` would hide the
  standard library's ``platform``). So the bundle starts exactly as ``python -m app`` does, including
  the ``--reap-engine`` helper mode that skips the app's other imports.
- Only the Qt modules the app imports are kept (``QT_MODULES``); the others are excluded by name.
- ``uv``'s static binary ships in the bundle (``uv/uv``): the mlx-lm backend makes its virtual
  environment with it, since a frozen app has no ``python -m venv`` of its own.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import plistlib
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = "lemon-desk"
APP_NAME = "Lemon Desk"
BUNDLE_ID = "org.lemonade-sdk.lemon-desk"
# The Qt modules the app (and qasync) import; every other PySide6 module is left out.
QT_MODULES = {"QtCore", "QtGui", "QtWidgets", "QtNetwork"}
# Standard-library parts nothing in the app uses, which PyInstaller would otherwise pull in.
UNUSED_STDLIB = ["tkinter", "unittest", "pydoc_data", "lib2to3", "idlelib", "test"]

INSTALL_NOTE = """\
Lemon Desk {version} for Linux ({arch})

Install:
    mkdir -p ~/.local/opt
    tar -xzf lemon-desk-{version}-linux-{arch}.tar.gz -C ~/.local/opt
    ~/.local/opt/lemon-desk/lemon-desk --install-desktop-entry

The second command adds Lemon Desk to your applications menu (with its icon); start it from there with
a double-click, or run ~/.local/opt/lemon-desk/lemon-desk from a terminal (the same commands as the
pip-installed `lemon-desk`: `lemon-desk --help`).

Uninstall: delete ~/.local/opt/lemon-desk and ~/.local/share/applications/lemon-desk.desktop.
Your settings, engines and chats stay in the same folders the pip-installed app uses
(LEMON_DESK_HOME, else ~/.local/share/lemon-desk).
"""


def version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def arch() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "aarch64": "arm64"}.get(machine, machine)


def source_files() -> list[Path]:
    """Every file the bundle is made from (for ``source_hash``): the code, its data and this script."""
    files = [ROOT / "pyproject.toml", Path(__file__).resolve()]
    for folder in ("app", "resources", "packaging"):
        files += [p for p in (ROOT / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return sorted(files)


def source_hash() -> str:
    """A hash of the sources and of the Python that builds them: equal hashes give equal bundles."""
    digest = hashlib.sha256(f"{sys.version} {platform.machine()}".encode())
    for path in source_files():
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def stage(stage_dir: Path) -> Path:
    """The source laid out like an installed wheel; returns the entry script."""
    shutil.rmtree(stage_dir, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "app", stage_dir / "app", ignore=ignore)
    shutil.copytree(ROOT / "resources", stage_dir / "app" / "resources", ignore=ignore)
    packaging = stage_dir / "app" / "packaging"
    (packaging / "icons").mkdir(parents=True)
    shutil.copy2(ROOT / "packaging" / f"{NAME}.desktop.in", packaging)
    for icon in (ROOT / "packaging" / "icons").iterdir():
        shutil.copy2(icon, packaging / "icons")
    entry = stage_dir / "lemon_desk_main.py"
    shutil.copy2(ROOT / "app" / "__main__.py", entry)
    return entry


def unused_qt_modules() -> list[str]:
    import PySide6

    found = {p.name.split(".")[0] for p in Path(PySide6.__file__).parent.glob("Qt*.*") if p.suffix != ".pyi"}
    return sorted(f"PySide6.{m}" for m in found - QT_MODULES if m.startswith("Qt"))


def uv_binary() -> Path:
    from uv import find_uv_bin

    return Path(find_uv_bin())


def mac_icon(work: Path) -> Path:
    """An .icns made from the PNG icons with macOS's own ``iconutil``."""
    iconset = work / f"{NAME}.iconset"
    shutil.rmtree(iconset, ignore_errors=True)
    iconset.mkdir(parents=True)
    icons = ROOT / "packaging" / "icons"
    for size in (16, 32, 128):
        shutil.copy2(icons / f"{NAME}-{size}.png", iconset / f"icon_{size}x{size}.png")
        shutil.copy2(icons / f"{NAME}-{size * 2}.png", iconset / f"icon_{size}x{size}@2x.png")
    shutil.copy2(icons / f"{NAME}-256.png", iconset / "icon_256x256.png")
    icns = work / f"{NAME}.icns"
    subprocess.run(["iconutil", "-c", "icns", str(iconset), "-o", str(icns)], check=True)
    return icns


def run_pyinstaller(entry: Path, dist: Path, work: Path) -> None:
    import PyInstaller.__main__

    sep = os.pathsep
    args = [
        str(entry),
        "--name",
        NAME,
        "--onedir",
        "--noconfirm",
        "--log-level",
        "WARN",
        "--distpath",
        str(dist),
        "--workpath",
        str(work),
        "--specpath",
        str(work),
        "--paths",
        str(entry.parent),
        "--collect-submodules",
        "app",
        "--add-data",
        f"{entry.parent / 'app' / 'resources'}{sep}app/resources",
        "--add-data",
        f"{entry.parent / 'app' / 'packaging'}{sep}app/packaging",
        "--add-binary",
        f"{uv_binary()}{sep}uv",
    ]
    for module in [*unused_qt_modules(), *UNUSED_STDLIB]:
        args += ["--exclude-module", module]
    if sys.platform == "darwin":
        args += ["--windowed", "--osx-bundle-identifier", BUNDLE_ID, "--icon", str(mac_icon(work))]
    PyInstaller.__main__.run(args)


def linux_archive(dist: Path) -> Path:
    note = INSTALL_NOTE.format(version=version(), arch=arch())
    (dist / NAME / "INSTALL.txt").write_text(note)
    archive = dist / f"{NAME}-{version()}-linux-{arch()}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(dist / NAME, arcname=NAME)
    return archive


def mac_app_and_dmg(dist: Path, work: Path) -> Path:
    """``Lemon Desk.app`` with a complete Info.plist, signed ad hoc, and a compressed .dmg of it."""
    app = dist / f"{APP_NAME}.app"
    shutil.rmtree(app, ignore_errors=True)
    (dist / f"{NAME}.app").rename(app)
    plist_path = app / "Contents" / "Info.plist"
    info = plistlib.loads(plist_path.read_bytes())
    info.update(
        CFBundleName=APP_NAME,
        CFBundleDisplayName=APP_NAME,
        CFBundleIdentifier=BUNDLE_ID,
        CFBundleShortVersionString=version(),
        CFBundleVersion=version(),
        CFBundleIconFile=f"{NAME}.icns",
        NSHighResolutionCapable=True,
        LSMinimumSystemVersion="11.0",
    )
    plist_path.write_bytes(plistlib.dumps(info))
    # Info.plist changed after PyInstaller signed the bundle: sign it again (ad hoc) and check.
    subprocess.run(["codesign", "--force", "--deep", "--sign", "-", str(app)], check=True)
    subprocess.run(["codesign", "--verify", "--deep", "--strict", str(app)], check=True)
    folder = work / "dmg"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    shutil.copytree(app, folder / app.name, symlinks=True)
    (folder / "Applications").symlink_to("/Applications")
    dmg = dist / f"{NAME}-{version()}-macos-{arch()}.dmg"
    dmg.unlink(missing_ok=True)
    hdiutil = ["hdiutil", "create", "-volname", APP_NAME, "-srcfolder", str(folder), "-ov", "-format", "UDZO"]
    subprocess.run([*hdiutil, str(dmg)], check=True)
    return dmg


def build(dist: Path, work: Path) -> list[Path]:
    """Build the bundle and its archive for this machine; returns what it wrote."""
    entry = stage(work / "stage")
    shutil.rmtree(dist / NAME, ignore_errors=True)
    run_pyinstaller(entry, dist, work / "pyinstaller")
    (dist / NAME / "SOURCE_HASH").write_text(source_hash() + "\n")
    if sys.platform == "darwin":
        return [dist / NAME, dist / f"{APP_NAME}.app", mac_app_and_dmg(dist, work)]
    if sys.platform.startswith("linux"):
        return [dist / NAME, linux_archive(dist)]
    raise SystemExit(f"No package is defined for {sys.platform}: build on macOS or Linux.")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dist", type=Path, default=ROOT / "dist", help="where the package goes")
    parser.add_argument("--work", type=Path, default=ROOT / "build", help="PyInstaller's work folder")
    parser.add_argument("--print-hash", action="store_true", help="print the source hash and exit")
    args = parser.parse_args()
    if args.print_hash:
        print(source_hash())
        return 0
    started = time.monotonic()
    written = build(args.dist.resolve(), args.work.resolve())
    for path in written:
        print(path)
    print(f"built in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
