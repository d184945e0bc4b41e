"""``lemon-desk collections [list|save|load|export|import|rm]``: named sets of models with their options.

A command keeps no model loaded past its own end, and finds no running window or ``serve`` to ask
(the window answers another launch only with "show"; ``serve`` leaves no trace of its port, and the
window's port may be another home's app or a Lemonade Server). So ``save`` is given its models, and
``load`` says to serve the collection (``lemon-desk serve --collection NAME``) rather than load it
into a process that stops it at once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from app.commands.output import load_settings_noting_problems, print_json, table
from app.core.errors import ConfigError
from app.store.collections import Collection, collection_to_json
from app.supervisor.router import Router

ACTIONS = ("list", "save", "load", "export", "import", "rm")
USAGE = {
    "save": "collections save NAME MODEL...",
    "load": "collections load NAME",
    "export": "collections export NAME FILE",
    "import": "collections import FILE [--replace]",
    "rm": "collections rm NAME",
}
ARITY = {"list": (0, 0), "save": (2, None), "load": (1, 1), "export": (2, 2), "import": (1, 1), "rm": (1, 1)}
NO_LOADED_MODELS = (
    "A command has no loaded models to save: models stay loaded only while the window or "
    "`lemon-desk serve` runs."
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "collections",
        help="named sets of models with their options: save, load, export, import (Lemonade's format)",
        description="list | save NAME MODEL... | load NAME (to serve it: lemon-desk serve --collection "
        "NAME) | export NAME FILE | import FILE [--replace] | rm NAME",
    )
    p.add_argument("action", nargs="?", choices=ACTIONS, default="list")
    p.add_argument("operands", nargs="*", metavar="ARG")
    p.add_argument("--replace", action="store_true", help="import: over a collection of the same name")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=cmd_collections)


def _summary(c: Collection) -> dict[str, Any]:
    return {"name": c.name, "models": c.model_names, "collection": collection_to_json(c)}


def _print_list(collections: list[Collection]) -> None:
    if not collections:
        print("No collections. `lemon-desk collections save NAME [MODEL...]` makes one.")
        return
    rows = [["name", "models"]]
    rows += [[c.name, ", ".join(c.model_names)] for c in collections]
    print(table(rows))


def cmd_collections(args: argparse.Namespace) -> int:
    low, high = ARITY[args.action]
    n = len(args.operands)
    if n < low or (high is not None and n > high):
        usage = USAGE.get(args.action, "collections [--json]")
        raise ConfigError(f"Usage: lemon-desk {usage}", NO_LOADED_MODELS if args.action == "save" else "")
    router = Router(load_settings_noting_problems())
    keeper = router.collections
    for warning in router.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    ops = args.operands
    result: dict[str, Any]
    if args.action == "list":
        collections = keeper.all()
        if not args.json:
            _print_list(collections)
            return 0
        result = {"collections": [_summary(c) for c in collections]}
    elif args.action == "save":
        saved = keeper.save(ops[0], ops[1:])
        result = _summary(saved)
        said = f"Saved collection {saved.name}: {', '.join(saved.model_names)}."
    elif args.action == "load":
        name = keeper.get(ops[0]).name
        raise ConfigError(
            f"Nothing was loaded: this command would stop the models of {name} again as it ends, "
            "and models stay loaded only while the window or `lemon-desk serve` runs.",
            f"Serve the collection: lemon-desk serve --collection {name}",
        )
    elif args.action == "export":
        exported = keeper.export(ops[0], Path(ops[1]))
        result = {"name": exported.name, "file": str(Path(ops[1]).resolve())}
        said = f"Exported {exported.name} to {result['file']}."
    elif args.action == "import":
        imported = keeper.import_file(Path(ops[0]), replace=args.replace)
        for warning in imported.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        result = {**_summary(imported.collection), "registered": list(imported.registered)}
        result["warnings"] = list(imported.warnings)
        said = (
            f"Imported collection {imported.collection.name}: {', '.join(imported.collection.model_names)}."
        )
    else:
        keeper.remove(ops[0])
        result = {"removed": ops[0]}
        said = f"Removed collection {ops[0]} (its models stay)."
    if args.json:
        print_json(result)
    else:
        print(said)
    return 0
