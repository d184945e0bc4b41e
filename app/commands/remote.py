"""``lemon-desk remote add | list | rm``: other machines' servers (another Lemon Desk, a Lemonade Server,
any OpenAI-compatible server) whose models are used here as ``@NAME/MODEL``.

The key goes to the OS keychain and nowhere else. It can be given three ways: ``--api-key KEY`` (the
issue's form; note that other users of the machine can read a command line), the environment
(``LEMON_DESK_REMOTE_API_KEY``), or ``--ask-key`` (typed at a prompt, or one line on stdin).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import sys

from app.commands.output import load_settings_noting_problems, print_json, table
from app.core.errors import ConfigError
from app.core.remotes import RemoteState
from app.supervisor.remote_views import RemoteSnapshot
from app.supervisor.router import Router

KEY_VARIABLE = "LEMON_DESK_REMOTE_API_KEY"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "remote",
        help="other machines' servers whose models are used here as @NAME/MODEL",
        description="A remote is another Lemon Desk (its local API), a Lemonade Server or any "
        "OpenAI-compatible server. Its models appear as @NAME/MODEL in `models`, the window, the tray "
        "and the local API, and `run`, `bench` and chats go to it. Without a subcommand: list.",
    )
    parser.set_defaults(handler=cmd_list, json=False)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")

    add = verbs.add_parser(
        "add",
        help="add a remote server",
        description="Add a remote. URL is its server root (http://HOST:PORT); a /v1 or /api/v1 at its "
        "end is dropped. The key is kept in the OS keychain only. Give it with --api-key KEY (visible "
        f"to other users in the process list while the command runs), ${KEY_VARIABLE}, or --ask-key.",
    )
    add.add_argument("name", metavar="NAME", help="letters, digits, '.', '_' and '-'")
    add.add_argument("url", metavar="URL", help="e.g. http://192.168.1.20:13305")
    keys = add.add_mutually_exclusive_group()
    keys.add_argument("--api-key", metavar="KEY", help=f"the remote's API key (or set ${KEY_VARIABLE})")
    keys.add_argument("--ask-key", action="store_true", help="type the key at a prompt (or give it on stdin)")
    add.add_argument("--json", action="store_true", help="print JSON")
    add.set_defaults(handler=cmd_add)

    listing = verbs.add_parser("list", help="every remote: its address, state and models (looked at now)")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(handler=cmd_list)

    rm = verbs.add_parser("rm", help="remove a remote (and its key from the keychain)")
    rm.add_argument("name", metavar="NAME")
    rm.set_defaults(handler=cmd_rm)


def _key(args: argparse.Namespace) -> str | None:
    if args.ask_key:
        if sys.stdin.isatty():
            key = getpass.getpass(f"API key for {args.name} (not shown): ")
        else:
            key = sys.stdin.readline().strip()
        if not key:
            raise ConfigError("No key was given.", "Type the key, or leave out --ask-key if it needs none.")
        return key.strip()
    return (args.api_key or os.environ.get(KEY_VARIABLE) or "").strip() or None


def _describe(snapshot: RemoteSnapshot) -> str:
    if snapshot.state is RemoteState.REACHABLE:
        kind = f"{snapshot.kind.value} {snapshot.version}".strip() if snapshot.kind else ""
        models = ", ".join(f"@{snapshot.name}/{m.id}" for m in snapshot.models) or "no models yet"
        return f"reachable ({kind}): {models}"
    return f"{snapshot.state.value}: {snapshot.message}"


def cmd_add(args: argparse.Namespace) -> int:
    key = _key(args)
    router = Router(load_settings_noting_problems())

    async def add() -> RemoteSnapshot:
        async with router:
            return await router.remotes.add(args.name, args.url, key)

    snapshot = asyncio.run(add())
    if args.json:
        print_json(snapshot.to_json())
        return 0
    print(f"Added the remote {snapshot.name} ({snapshot.url}): {_describe(snapshot)}")
    if snapshot.state is not RemoteState.REACHABLE:
        print(
            f"warning: {snapshot.name} is kept all the same; its models appear once it answers.",
            file=sys.stderr,
        )
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    router = Router(load_settings_noting_problems())
    for warning in router.remotes.warnings:
        print(f"warning: {warning}", file=sys.stderr)

    async def look() -> list[RemoteSnapshot]:
        async with router:
            return await router.remotes.refresh()

    snapshots = asyncio.run(look()) if router.remotes.names() else []
    if args.json:
        print_json({"remotes": [s.to_json() for s in snapshots]})
        return 0
    if not snapshots:
        print("No remotes. Add one with `lemon-desk remote add NAME URL [--api-key KEY]`.")
        return 0
    rows = [["name", "url", "state", "kind", "models"]]
    for s in snapshots:
        kind = f"{s.kind.value} {s.version}".strip() if s.kind else ""
        rows.append([s.name, s.url, s.state.value, kind, str(len(s.models))])
    print(table(rows))
    for s in snapshots:
        if s.message:
            print(f"{s.name}: {s.message}")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    router = Router(load_settings_noting_problems())

    async def remove() -> None:
        async with router:
            await router.remotes.remove(args.name)

    asyncio.run(remove())
    print(f"Removed the remote {args.name} (and its key, if it had one).")
    return 0
