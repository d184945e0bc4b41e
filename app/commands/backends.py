"""``lemon-desk backends``: list backends and their states; install, update or uninstall one."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from app.commands.output import ProgressBar, load_settings_noting_problems, print_json, table
from app.core.backends import BackendKey
from app.store.library import location_on_demand
from app.supervisor.supervisor import Supervisor


def _supervisor() -> Supervisor:
    settings = load_settings_noting_problems()
    # Lists, installs and removes backends, never an engine: the engines an earlier run left are not its
    # business (the next command that launches one stops them).
    return Supervisor(settings, resolve_model=location_on_demand(settings), clean_start=False)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("backends", help="engine backends: list, install, uninstall")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(handler=cmd_list)
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    install = actions.add_parser("install", help="install or update RECIPE:BACKEND from its pinned release")
    install.add_argument("backend", metavar="RECIPE:BACKEND")
    install.add_argument("--json", action="store_true", help="print JSON")
    install.set_defaults(handler=cmd_install)
    uninstall = actions.add_parser("uninstall", help="remove an installed RECIPE:BACKEND")
    uninstall.add_argument("backend", metavar="RECIPE:BACKEND")
    uninstall.add_argument("--json", action="store_true", help="print JSON")
    uninstall.set_defaults(handler=cmd_uninstall)


def cmd_list(args: argparse.Namespace) -> int:
    info = asyncio.run(_supervisor().info())
    if args.json:
        data: dict[str, Any] = {}
        for recipe, support in info.recipes.items():
            data[recipe] = support.to_json()
            for name, status in support.backends.items():
                data[recipe]["backends"][name]["installed_version"] = status.installed_version
        print_json({"recipes": data})
        return 0
    rows = [["backend", "state", "pinned", "installed", "details"]]
    for recipe, support in info.recipes.items():
        for name, s in support.backends.items():
            default = " (default)" if name == support.default_backend else ""
            rows.append(
                [
                    f"{recipe}:{name}{default}",
                    s.state.value,
                    s.version,
                    s.installed_version or "-",
                    s.shown_message,
                ]
            )
    print(table(rows))
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    key = BackendKey.parse(args.backend)
    bar = ProgressBar()

    async def go() -> Any:
        async with _supervisor() as supervisor:
            supervisor.subscribe(bar.on_event)
            try:
                return await supervisor.install(key.recipe, key.backend)
            finally:
                bar.close()

    manifest = asyncio.run(go())
    if args.json:
        print_json({"backend": args.backend, "version": manifest.version, "sha256": manifest.sha256})
    else:
        print(f"{args.backend} {manifest.version} is installed (sha256 {manifest.sha256}).")
    return 0


def cmd_uninstall(args: argparse.Namespace) -> int:
    key = BackendKey.parse(args.backend)

    async def go() -> bool:
        async with _supervisor() as supervisor:
            return await supervisor.uninstall(key.recipe, key.backend)

    removed = asyncio.run(go())
    if args.json:
        print_json({"backend": args.backend, "removed": removed})
    else:
        print(f"Removed {args.backend}." if removed else f"{args.backend} was not installed.")
    return 0
