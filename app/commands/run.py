"""``lemon-desk run MODEL``: load a model through the router (one click: download it and install its backend
first when needed), answer one prompt (or chat in the terminal), stop the engine."""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
from typing import Any

from app.client.events import ChatDelta, ChatDone
from app.commands.output import (
    LoadLines,
    add_rpc_argument,
    checked_rpc,
    load_settings_noting_problems,
    print_json,
    telemetry_line,
)
from app.commands.repl import chat_in_terminal
from app.commands.tools import TerminalAsk, ToolUse, read_stdin_line, show_tool_event, start_servers
from app.core.backends import BackendKey
from app.core.context import Overflow
from app.core.errors import ConfigError
from app.core.launch import AUTO_CTX_SIZE, ctx_size_problem
from app.core.models import Model
from app.core.remotes import is_remote_model
from app.core.tools import TOOL_EVENTS, ToolsWithheld
from app.store.model_options import ModelOptions
from app.supervisor.router import Router


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "run",
        help="load a model and answer a prompt, or chat in the terminal",
        description="MODEL is a catalog name, a local .gguf file, a local MLX folder, or @REMOTE/MODEL "
        "(a model of a remote server: see `lemon-desk remote`).",
    )
    parser.add_argument("model", metavar="MODEL")
    parser.add_argument("--backend", metavar="RECIPE:BACKEND", help="default: the best one installed here")
    parser.add_argument(
        "--ctx-size", type=int, metavar="N", help="context size in tokens (-1: automatic, as without it)"
    )
    parser.add_argument(
        "--args", default="", metavar='"..."', help='extra engine arguments, e.g. --args="--no-mmap -t 4"'
    )
    parser.add_argument("--prompt", metavar="TEXT", help="answer this and exit (else: an interactive chat)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (with --prompt)")
    parser.add_argument("--dry-run", action="store_true", help="print the engine command; start nothing")
    parser.add_argument("--force", action="store_true", help="load even if it needs more memory than is free")
    parser.add_argument(
        "--mcp",
        action="append",
        default=[],
        metavar="NAME",
        help="let the model call the tools of this configured MCP server (again for more); each call asks "
        "on the terminal first",
    )
    parser.add_argument(
        "--allow-tools", action="store_true", help="with --mcp: run every call without asking"
    )
    parser.add_argument(
        "--on-overflow",
        choices=[way.value for way in Overflow],
        help="in the terminal chat, when a message would not fit the model's context: reload with a "
        "larger context, go on from a summary, or leave out the oldest turns (default: ask)",
    )
    add_rpc_argument(parser)
    parser.set_defaults(handler=cmd_run)


def _options(model: Model, args: argparse.Namespace) -> ModelOptions:
    backend = args.backend
    if backend and ":" in backend:
        key = BackendKey.parse(backend)
        backend = key.backend
        if key.recipe != model.recipe:
            raise ConfigError(
                f"{model.name} is a {model.recipe} model; {args.backend} is a {key.recipe} backend.",
                f"Pick a {model.recipe} backend.",
            )
    ctx_size = args.ctx_size
    if ctx_size is not None and (why := ctx_size_problem(ctx_size)):
        raise ConfigError(f"--ctx-size {why}.")
    if ctx_size == AUTO_CTX_SIZE:
        ctx_size = None
    return ModelOptions(backend=backend or None, ctx_size=ctx_size, args=args.args, rpc=checked_rpc(args))


def cmd_run(args: argparse.Namespace) -> int:
    if args.json and args.prompt is None and not args.dry_run:
        raise ConfigError("--json needs --prompt or --dry-run; the terminal chat is for people.")
    if args.allow_tools and not args.mcp:
        raise ConfigError("--allow-tools goes with --mcp NAME: without a server there are no tools.")
    router = Router(load_settings_noting_problems())
    if is_remote_model(args.model):
        return asyncio.run(_run_remote(router, args))
    model = router.catalog.find(args.model)
    options = _options(model, args)
    if args.dry_run:
        return asyncio.run(_dry_run(router, model, options, args.json))
    return asyncio.run(_run(router, model, options, args))


async def _dry_run(router: Router, model: Model, options: ModelOptions, as_json: bool) -> int:
    plan = await router.backends.dry_run(model, options, dict(os.environ))
    if as_json:
        print_json({"command": list(plan.argv), "env": plan.env, "device": plan.device.value})
    else:
        for name, value in plan.env.items():
            print(f"{name}={shlex.quote(value)}")
        print(shlex.join(plan.argv))
    return 0


async def _run(router: Router, model: Model, options: ModelOptions, args: argparse.Namespace) -> int:
    async with router:
        router.subscribe(LoadLines())
        await router.load(model, options, force=args.force)
        name = model.name  # its engine's id
        engine = router.engines.get(name)
        assert engine is not None  # loaded just now
        backend = str(engine.backend)
        tools = await _tools(router, args)
        if args.prompt is None:
            overflow = Overflow(args.on_overflow) if args.on_overflow else None
            await chat_in_terminal(router, name, local=True, tools=tools, on_overflow=overflow)
            return 0
        reply, reasoning, done = await _answer(router, name, args.prompt, echo=not args.json, tools=tools)
    if args.json:
        result: dict[str, Any] = {"model": model.name, "backend": backend, "reply": reply}
        if reasoning:
            result["reasoning"] = reasoning
        result["telemetry"] = done.telemetry.to_json()
        print_json(result)
    else:
        print(telemetry_line(done.telemetry), file=sys.stderr)
    return 0


async def _run_remote(router: Router, args: argparse.Namespace) -> int:
    """A remote model: its remote loads it (Lemon Desk and Lemonade) and answers; the figures are
    measured here, and the remote's own ``stats`` are added when it has them."""
    local_only = [args.backend, args.ctx_size, args.args, args.dry_run, args.force]
    if any(local_only):
        raise ConfigError(
            "--backend, --ctx-size, --args, --dry-run and --force set how a model runs on this machine; "
            f"{args.model} runs as its remote runs it.",
            "Set its options on the remote.",
        )
    async with router:
        print(f"{args.model}: loading on its remote", file=sys.stderr, flush=True)
        await router.remotes.load(args.model)
        tools = await _tools(router, args)
        if args.prompt is None:
            await chat_in_terminal(router, args.model, tools=tools)
            return 0
        reply, reasoning, done = await _answer(
            router, args.model, args.prompt, echo=not args.json, tools=tools
        )
        stats = await router.remotes.stats(args.model)
    if args.json:
        result: dict[str, Any] = {"model": args.model, "backend": "remote", "reply": reply}
        if reasoning:
            result["reasoning"] = reasoning
        result["telemetry"] = done.telemetry.to_json()
        result["remote_stats"] = stats
        print_json(result)
    else:
        print(telemetry_line(done.telemetry), file=sys.stderr)
    return 0


async def _tools(router: Router, args: argparse.Namespace) -> ToolUse | None:
    """The MCP servers the run's model may use (``--mcp``), started and ready; None without any."""
    if not args.mcp:
        return None
    use = ToolUse(tuple(dict.fromkeys(args.mcp)), args.allow_tools)
    await start_servers(router, use)
    return use


async def _answer(
    router: Router, engine_id: str, prompt: str, echo: bool, tools: ToolUse | None = None
) -> tuple[str, str, ChatDone]:
    reply: list[str] = []
    reasoning: list[str] = []
    done: ChatDone | None = None
    messages = [{"role": "user", "content": prompt}]
    stream = (
        router.chat_with_tools(
            engine_id, messages, ask=TerminalAsk(read_stdin_line, tools.allow_all), servers=tools.servers
        )
        if tools is not None
        else router.stream_chat(engine_id, messages)
    )
    async for event in stream:
        if isinstance(event, TOOL_EVENTS):
            if echo or isinstance(event, ToolsWithheld):  # said on stderr: --json's answer stays whole
                show_tool_event(event)
        elif isinstance(event, ChatDelta):
            reply.append(event.content)
            reasoning.append(event.reasoning)
            if echo:
                sys.stderr.write(event.reasoning)
                sys.stdout.write(event.content)
                sys.stdout.flush()
        else:
            done = event
    if echo:
        print()
    assert done is not None  # a stream ends with ChatDone or raises
    return "".join(reply), "".join(reasoning), done
