"""``lemon-desk bench MODEL ...``: prompt processing and generation speed per model and backend, measured
by the router as llama-bench measures, printed as a table of medians with their spread (or ``--json``),
and kept with the hardware and versions in the app's home."""

from __future__ import annotations

import argparse
import asyncio
import sys

from app.commands.output import (
    add_rpc_argument,
    checked_rpc,
    load_settings_noting_problems,
    print_json,
    table,
)
from app.core.bench import (
    DEFAULT_GEN_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    DEFAULT_REPETITIONS,
    BenchRun,
    BenchSpec,
    hardware_summary,
    pair,
    table_rows,
)
from app.core.errors import ConfigError
from app.supervisor.bench import BenchProgress, bench
from app.supervisor.router import Router


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "bench",
        help="measure prompt processing and generation speed per model and backend",
        description="Loads each MODEL on each backend and measures it as llama-bench does: a prompt of "
        "exactly N tokens with the prompt cache off, then exactly M generated tokens, R times.",
    )
    parser.add_argument("models", nargs="*", metavar="MODEL")
    parser.add_argument(
        "--backend", action="append", default=[], metavar="RECIPE:BACKEND", help="repeat for an A/B"
    )
    parser.add_argument("--pair", metavar="BASE", help="add the catalog models sharing BASE (Qwen3-0.6B)")
    parser.add_argument("--prompt-tokens", type=int, default=DEFAULT_PROMPT_TOKENS, metavar="N")
    parser.add_argument("--gen-tokens", type=int, default=DEFAULT_GEN_TOKENS, metavar="M")
    parser.add_argument("--repetitions", type=int, default=DEFAULT_REPETITIONS, metavar="R")
    parser.add_argument(
        "--args", default="", metavar='"..."', help='extra engine arguments, e.g. --args="-t 2"'
    )
    parser.add_argument("--force", action="store_true", help="load even if it needs more memory than is free")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    add_rpc_argument(parser)
    parser.set_defaults(handler=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    router = Router(load_settings_noting_problems())
    models = list(args.models)
    if args.pair:
        models += [m for m in pair(router.catalog.models(), args.pair) if m not in models]
    if not models:
        raise ConfigError("Name at least one model to benchmark (or --pair BASE).")
    spec = BenchSpec(
        tuple(models),
        tuple(args.backend),
        args.prompt_tokens,
        args.gen_tokens,
        args.repetitions,
        args.args,
        checked_rpc(args),
        args.force,
    )
    spec.check()
    run = asyncio.run(_bench(router, spec))
    for warning in router.warnings:
        if "bench" in warning:
            print(f"warning: {warning}", file=sys.stderr)
    if args.json:
        print_json(run.to_json())
    else:
        print(f"Hardware: {hardware_summary(run.hardware)}")
        print(table(table_rows(run.results)))
    return 0


async def _bench(router: Router, spec: BenchSpec) -> BenchRun:
    async with router:
        return await bench(router, spec, _progress_line)


def _progress_line(event: object) -> None:
    if isinstance(event, BenchProgress) and event.detail != "done":
        where = f" on {event.backend}" if event.backend else ""
        print(
            f"[{event.done}/{event.total}] {event.model}{where}: {event.detail}", file=sys.stderr, flush=True
        )
