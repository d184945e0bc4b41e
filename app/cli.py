"""``lemon-desk``: the window with no arguments, or a headless subcommand.

Every failure a user can cause ends in one clear line on stderr and a non-zero exit, never a traceback.
The subcommands' modules are imported only when there are arguments to parse: the window (no arguments)
must not pay for the supervisor, the Hub client and their libraries before it shows.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from app import __version__
from app.core.errors import ConfigError, LemonDeskError
from app.store.settings import load_settings

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130


def cmd_system_info(args: argparse.Namespace) -> int:
    from app.commands.output import print_json, table
    from app.supervisor.system_info import gather

    loaded = load_settings()
    if loaded.warning:
        print(f"warning: {loaded.warning}", file=sys.stderr)
    info = gather(loaded.settings)
    if args.json:
        print_json(info.to_json())
        return 0
    hw = info.hardware
    print(f"OS / arch : {hw.os} {hw.arch}")
    print(f"CPU       : {hw.cpu.name} ({hw.cpu.cores} cores, {hw.cpu.threads} threads)")
    print(f"Memory    : {hw.memory_gb:g} GB")
    for gpu in hw.amd_gpu:
        kind = "integrated" if gpu.integrated else "discrete"
        print(f"AMD GPU   : {gpu.name} ({gpu.gfx}, {gpu.vram_gb:g} GB, {kind})")
    for nv in hw.nvidia_gpu:
        print(f"NVIDIA GPU: {nv.name} (compute {nv.compute_capability}, {nv.vram_gb:g} GB)")
    if hw.metal.available:
        print(f"Metal     : {hw.metal.name}")
    if not hw.has_gpu:
        print("GPU       : none found")
    for note in hw.notes:
        print(f"note: {note}")
    for recipe, support in info.recipes.items():
        print(f"\n{recipe} (default: {support.default_backend or 'none'})")
        rows = [["backend", "state", "version", "details"]]
        rows += [[name, s.state.value, s.version, s.shown_message] for name, s in support.backends.items()]
        print(table(rows))
    return 0


def cmd_install_desktop_entry(_args: argparse.Namespace) -> int:
    from app.desktop_entry import install_desktop_entry

    try:
        written = install_desktop_entry()
    except OSError as err:
        where = f" to {err.filename}" if err.filename else ""
        raise ConfigError(
            f"Could not write the desktop entry{where}: {err.strerror}.", "Check that the folder is writable."
        ) from None
    for path in written:
        print(f"wrote {path}")
    print("Lemon Desk is in your applications menu now.")
    return 0


class Parser(argparse.ArgumentParser):
    """argparse's parser (its subcommands' too), whose refusal of an option followed by a value that
    starts with '-' (``--args --no-mmap``: argparse takes ``--no-mmap`` for an option) says how to give
    such a value."""

    def error(self, message: str) -> NoReturn:
        missing = re.fullmatch(r"argument (--[\w-]+): expected one argument", message)
        if missing:
            option = missing[1]
            message += f"; a value that starts with '-' goes after an '=': {option}=\"-...\""
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    from app.commands import backends, bench, collections, downloads, models, remote, run, serve, worker

    parser: argparse.ArgumentParser = Parser(
        prog="lemon-desk", description="Run large language models locally."
    )
    parser.add_argument("--version", action="version", version=f"lemon-desk {__version__}")
    parser.add_argument(
        "--install-desktop-entry",
        action="store_const",
        dest="handler",
        const=cmd_install_desktop_entry,
        help="add Lemon Desk to your applications menu (Linux) and exit",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    info = sub.add_parser("system-info", help="the machine and which backends run on it")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(handler=cmd_system_info)
    backends.register(sub)
    run.register(sub)
    models.register(sub)
    downloads.register(sub)
    collections.register(sub)
    bench.register(sub)
    serve.register(sub)
    worker.register(sub)
    remote.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    handler: Callable[[argparse.Namespace], int] | None = None
    args = argparse.Namespace()
    if argv:
        args = build_parser().parse_args(argv)
        handler = getattr(args, "handler", None)
    try:
        if handler is None:
            from app.ui.launch import run_window

            return run_window()
        return handler(args)
    except LemonDeskError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): not an error. Quiet the flush at exit too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
