"""``lemon-desk search / pull / models / rm / import``: Hugging Face models, downloads, the library."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from app.commands.output import load_settings_noting_problems, print_json, table
from app.core.downloads import DownloadRecord
from app.core.errors import ModelError
from app.core.fit import DEFAULT_CONTEXT, FitEstimate
from app.core.names import MODEL_NAME_RULE
from app.core.params import format_params
from app.core.refs import GGUF_RECIPE, MLX_RECIPE, FileSet
from app.core.remotes import RemoteState
from app.core.units import GB
from app.platform import detect_hardware
from app.store.hfcache import RepoCache
from app.store.library import Library
from app.supervisor.downloads import DownloadProgress
from app.supervisor.hub import HubClient
from app.supervisor.hubsearch import fit_of
from app.supervisor.modelmeta import remote_parameter_count
from app.supervisor.remote_views import RemoteSnapshot
from app.supervisor.router import Catalog, Router

BAR_WIDTH = 30


def _positive(text: str) -> int:
    value = int(text) if text.isascii() and text.isdigit() else 0  # isdigit alone takes "²"
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return value


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """search, pull, models, rm, import."""
    search = sub.add_parser("search", help="search Hugging Face for GGUF and MLX models, with a fit estimate")
    search.add_argument("query")
    search.add_argument("--recipe", choices=(GGUF_RECIPE, MLX_RECIPE), help="only models this recipe runs")
    search.add_argument("--limit", type=_positive, default=10, help="how many repos (default 10)")
    search.add_argument("--ctx-size", type=_positive, default=DEFAULT_CONTEXT, help="tokens, for the fit")
    search.add_argument("--json", action="store_true", help="print JSON")
    search.set_defaults(handler=cmd_search)

    pull = sub.add_parser("pull", help="download a model (a name, or org/repo[:VARIANT])")
    pull.add_argument("model")
    pull.add_argument("--recipe", choices=(GGUF_RECIPE, MLX_RECIPE), help="for a repo that has both formats")
    pull.add_argument("--ctx-size", type=_positive, default=DEFAULT_CONTEXT, help="tokens, for the fit")
    pull.add_argument("--dry-run", action="store_true", help="show the files and the fit; download nothing")
    pull.add_argument("--json", action="store_true", help="print JSON")
    pull.set_defaults(handler=cmd_pull)

    models = sub.add_parser("models", help="catalog and user models: recipe, size, downloaded, state")
    models.add_argument("--json", action="store_true", help="print JSON")
    models.set_defaults(handler=cmd_models)

    for verb, pinned in (("pin", True), ("unpin", False)):
        what = "never unload" if pinned else "let the loading policy unload"
        pin = sub.add_parser(verb, help=f"{what} a model to make room or when idle (saved with its options)")
        pin.add_argument("model")
        pin.set_defaults(handler=cmd_pin, pinned=pinned)

    rm = sub.add_parser("rm", help="delete a model's files (files other models share are kept)")
    rm.add_argument("model")
    rm.set_defaults(handler=cmd_rm)

    imp = sub.add_parser("import", help="register a local GGUF file or MLX folder")
    imp.add_argument("path", type=Path)
    imp.add_argument(
        "--name",
        help=f"the model's name ({MODEL_NAME_RULE}), put in the user. namespace (default: the file's name)",
    )
    imp.set_defaults(handler=cmd_import)


def _warn(library: Library) -> None:
    for warning in library.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    library.warnings.clear()


def _library() -> Library:
    library = Library(load_settings_noting_problems())
    _warn(library)
    return library


def _size(n: int) -> str:
    return f"{n / GB:.2f} GB" if n >= GB / 10 else f"{n / 1e6:.1f} MB"


async def _params(hub: HubClient, files: FileSet) -> int | None:
    """The parameter count from the weight files' headers (Range reads); None when they say nothing."""
    try:
        return await remote_parameter_count(hub, files)
    except ModelError:
        return None


# -- search


async def _search(args: argparse.Namespace) -> list[dict[str, Any]]:
    async with Router(load_settings_noting_problems()) as router:
        results = await router.search_hub(args.query, args.recipe, args.limit, args.ctx_size)
    return [r.to_json() for r in results]


def cmd_search(args: argparse.Namespace) -> int:
    results = asyncio.run(_search(args))
    if args.json:
        print_json({"query": args.query, "context": args.ctx_size, "results": results})
        return 0
    if not results:
        print(f"No GGUF or MLX models match '{args.query}'.")
        return 0
    for r in results:
        gated = "  (gated: needs a token)" if r["gated"] else ""
        params = f"  {format_params(r['params'])} params" if r["params"] else ""
        popularity = f"{r['downloads']:,} downloads  {r['likes']:,} likes"
        print(f"{r['repo_id']}  [{r['recipe']}]{params}  {popularity}{gated}")
        if r["error"]:
            print(f"    {r['error']}")
        rows = [
            ["   ", v["name"], _size(v["size_bytes"]), v["fit"]["summary"] if v["fit"] else "fit unknown"]
            for v in r["variants"]
        ]
        if rows:
            print(table(rows))
    return 0


# -- pull


class _ProgressBar:
    """One line, redrawn in place, on a terminal."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.last = 0.0

    def __call__(self, event: object) -> None:
        if not isinstance(event, DownloadProgress):
            return
        now = time.monotonic()
        if now - self.last < 0.1 and event.done < event.total:
            return
        self.last = now
        share = event.done / event.total if event.total else 1.0
        filled = int(share * BAR_WIDTH)
        eta = f"{int(event.eta_s) // 60}:{int(event.eta_s) % 60:02d}" if event.eta_s is not None else "--:--"
        line = (
            f"\r{self.label} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {share:4.0%} "
            f"{event.done / GB:.2f}/{event.total / GB:.2f} GB {event.speed_bps / 1e6:7.1f} MB/s ETA {eta} "
            + (f"({event.cap.label()}) " if event.cap else "")
        )
        sys.stderr.write(line)
        sys.stderr.flush()


class _FileLines:
    """For logs, not terminals: one line per file as it starts."""

    def __init__(self) -> None:
        self.file = ""

    def __call__(self, event: object) -> None:
        if isinstance(event, DownloadProgress) and event.file != self.file:
            self.file = event.file
            capped = f" ({event.cap.label()})" if event.cap else ""
            print(f"fetching {event.file}{capped}", file=sys.stderr)


async def _pull(args: argparse.Namespace, router: Router) -> dict[str, Any]:
    library = router.catalog
    async with router:
        model, files = await router.plan_pull(args.model, args.recipe)
        hub = await router.hub()
        fit, fit_error = await fit_of(hub, files, detect_hardware(), args.ctx_size)
        # Shard headers are more requests: only a plan (--dry-run) waits for them.
        params = await _params(hub, files) if args.dry_run else None
        cache = RepoCache(library.cache_root, files.repo_id)
        report: dict[str, Any] = {
            "model": model.name,
            "checkpoint": model.checkpoint,
            "recipe": files.recipe,
            "variant": files.label,
            "revision": files.revision,
            "size_bytes": files.size,
            "params": params,
            "files": [{"path": f.path, "size": f.size, "cached": cache.has_blob(f)} for f in files.files],
            "fit": fit.to_json() if fit else None,
            "fit_error": fit_error or None,
            "dry_run": args.dry_run,
        }
        if not args.json:
            _print_plan(report, fit)
        if args.dry_run:
            return report
        router.downloads()
        for warning in router.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        if not args.json:
            router.subscribe(_ProgressBar(model.name) if sys.stderr.isatty() else _FileLines())
        record = await router.download(model, files)
    return _finish(report, record, library, model.name)


def _print_plan(report: dict[str, Any], fit: FitEstimate | None) -> None:
    params = f", {format_params(report['params'])} parameters" if report["params"] else ""
    what = f"{report['recipe']}, {_size(report['size_bytes'])}{params}"
    print(f"{report['model']}: {report['checkpoint']} ({what})")
    for f in report["files"]:
        print(f"  {f['path']}  {_size(f['size'])}{'  (already here)' if f['cached'] else ''}")
    print(f"fit: {fit.summary()}" if fit else f"fit unknown: {report['fit_error']}")


def _finish(report: dict[str, Any], record: DownloadRecord, library: Catalog, name: str) -> dict[str, Any]:
    report["state"] = record.state.value
    local = library.local_files(library.models()[name])
    if local is None:  # say so rather than "is ready: None"
        raise ModelError(
            f"The download of {name} ended ({record.state.value}), but its files are not complete in "
            f"{library.cache_root}.",
            f"Run `lemon-desk pull {name}` again; if it ends the same way, the repo lacks files that "
            "its index or shard names promise.",
        )
    report["path"] = str(local.main)
    return report


def cmd_pull(args: argparse.Namespace) -> int:
    router = Router(load_settings_noting_problems())
    try:
        report = asyncio.run(_pull(args, router))
    except KeyboardInterrupt:
        print(f"\nDownload paused; run `lemon-desk pull {args.model}` again to resume.", file=sys.stderr)
        raise
    if args.json:
        print_json(report)
    elif not args.dry_run:
        if sys.stderr.isatty():
            sys.stderr.write("\n")
        print(f"{report['model']} is ready: {report['path']}")
    return 0


# -- models, rm, import


async def _look_at_remotes(router: Router) -> list[RemoteSnapshot]:
    async with router:
        return await router.remotes.refresh()


def cmd_models(args: argparse.Namespace) -> int:
    router = Router(load_settings_noting_problems())
    views = router.statuses()
    # Each remote is asked for its models now (together; a remote that does not answer is said to be so).
    remotes = asyncio.run(_look_at_remotes(router)) if router.remotes.names() else []
    remote_views = [view for snapshot in remotes for view in snapshot.views()]
    # The router's own (model options set aside, say) as well as the library's.
    for warning in dict.fromkeys([*router.warnings, *router.catalog.take_warnings()]):
        print(f"warning: {warning}", file=sys.stderr)
    # From the files' headers, for the models on disk (the Hub is not asked here: `search` does).
    params = {v.name: router.local_parameter_count(v.model) if v.on_disk else None for v in views}
    if args.json:
        shown = [
            {**v.to_json(), "params": params[v.name], "labels": list(router.labels(v.model))} for v in views
        ]
        shown += [{**v.to_json(), "params": None} for v in remote_views]
        print_json({"models": shown, "remotes": [s.to_json() for s in remotes]})
        return 0
    rows = [["name", "recipe", "size", "params", "state", "checkpoint"]]
    for v in views:
        model = v.model
        size = f"{v.size_bytes / GB:.2f} GB"
        rows.append(
            [model.name, model.recipe, size, format_params(params[v.name]), v.status.text, model.checkpoint]
        )
    for r in remote_views:
        size = f"{r.info.size_bytes / GB:.2f} GB" if r.info.size_bytes else ""
        rows.append([r.name, r.info.recipe, size, "", r.status.value, f"on {r.remote.name} ({r.remote.url})"])
    print(table(rows))
    for snapshot in remotes:
        if snapshot.state is not RemoteState.REACHABLE:
            print(f"remote {snapshot.name} ({snapshot.url}) is {snapshot.state.value}: {snapshot.message}")
    return 0


def cmd_pin(args: argparse.Namespace) -> int:
    router = Router(load_settings_noting_problems())
    name = router.catalog.resolve(args.model).name
    router.set_pinned(name, args.pinned)
    print(f"{name} is {'pinned' if args.pinned else 'no longer pinned'}.")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    print(_library().remove(args.model))
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    model = _library().import_path(args.path, args.name)
    print(f"Imported {model.name} ({model.recipe}, {model.size_gb:g} GB) from {model.checkpoint}.")
    return 0
