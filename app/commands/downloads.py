"""``lemon-desk downloads [pause|resume|cancel MODEL]``: the downloads the app remembers, through the router.

A download belongs to the process that runs it: this command pauses or cancels only downloads no other
Lemon Desk process is running (the router says which one is), and ``resume`` runs the download here,
in the foreground, until it is done; Ctrl-C pauses it again, as in ``pull``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from app.commands.output import load_settings_noting_problems, print_json, table
from app.core.errors import ModelError
from app.core.units import GB
from app.supervisor.downloads import DownloadSnapshot
from app.supervisor.router import Router

ACTIONS = ("list", "pause", "resume", "cancel")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    downloads = sub.add_parser(
        "downloads",
        help="the model downloads the app remembers; pause, resume or cancel one",
        description="List downloads (state, progress, speed and ETA where known), or pause, resume "
        "(in the foreground; Ctrl-C pauses) or cancel the download of MODEL.",
    )
    downloads.add_argument("action", nargs="?", choices=ACTIONS, default="list")
    downloads.add_argument("model", nargs="?", help="the model (name or org/repo[:VARIANT])")
    downloads.add_argument(
        "--keep-partial", action="store_true", help="cancel: keep the partial files (a later pull resumes)"
    )
    downloads.add_argument("--json", action="store_true", help="print JSON")
    downloads.set_defaults(handler=cmd_downloads)


def _size(n: float) -> str:
    return f"{n / GB:.2f} GB"


def _speed(s: DownloadSnapshot) -> str:
    if s.speed_bps is None:
        return ""
    eta = f", ETA {int(s.eta_s) // 60}:{int(s.eta_s) % 60:02d}" if s.eta_s is not None else ""
    return f"{s.speed_bps / 1e6:.1f} MB/s{eta}"


def print_snapshots(snapshots: list[DownloadSnapshot]) -> None:
    if not snapshots:
        print("No downloads. `lemon-desk pull MODEL` starts one.")
        return
    rows = [["model", "state", "progress", "speed", "details"]]
    for s in snapshots:
        details = s.cap.label() if s.cap else s.record.message
        progress = f"{s.percent:5.1f}% {_size(s.done)}/{_size(s.total)}"
        rows.append([s.record.model, s.record.state.value, progress, _speed(s), details])
    print(table(rows))


async def _act(args: argparse.Namespace, router: Router) -> dict[str, Any]:
    async with router:
        name = router.catalog.resolve(args.model).name
        if args.action == "pause":
            await router.pause_download(name)
        elif args.action == "cancel":
            await router.cancel_download(name, keep_partial=args.keep_partial)
        else:
            await router.resume_download(name)
            rid = router.catalog.resolve(name).checkpoint
            if not args.json:
                print(f"resuming {name}; Ctrl-C pauses it", file=sys.stderr)
            await router.downloads().outcome(rid)
        snapshot = next((s for s in router.download_snapshots() if s.record.model == name), None)
        if snapshot is None:
            raise ModelError(f"There is no download of {name}.", "`lemon-desk downloads` lists them.")
        return snapshot.to_json()


def cmd_downloads(args: argparse.Namespace) -> int:
    router = Router(load_settings_noting_problems())
    if args.action == "list":
        if args.model is not None:
            raise ModelError("`downloads` lists every download; give MODEL with pause, resume or cancel.")
        snapshots = router.download_snapshots()
        for warning in router.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        if args.json:
            print_json({"downloads": [s.to_json() for s in snapshots]})
        else:
            print_snapshots(snapshots)
        return 0
    if args.model is None:
        raise ModelError(f"`downloads {args.action}` needs the model whose download to {args.action}.")
    try:
        result = asyncio.run(_act(args, router))
    except KeyboardInterrupt:
        print(f"\nDownload paused; run `lemon-desk downloads resume {args.model}` to go on.", file=sys.stderr)
        raise
    if args.json:
        print_json(result)
    else:
        print(
            f"{result['model']}: {result['state']} ({result['percent']:.1f}%). {result['message']}".rstrip()
        )
    return 0
