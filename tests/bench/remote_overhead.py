"""A remote's overhead: decode tok/s and time to first token through a remote Lemon Desk, against talking to
llama-server directly, on the real llama-server and SmolLM2-135M, all on loopback (so the figures show
what the app's hops cost, not a network's).

- direct: a llama-server started here with the same options as B's engine;
- one hop: B's local API (`lemon-desk serve`, a real child process) naming ``user.smol``;
- two hops: A's local API (another `serve`, with B added as the remote ``b``) naming ``@b/user.smol``: A's
  router hands the request to its remote client, which sends it to B, which sends it to its engine.

On a machine with few cores the hops' own work competes with the engine for the CPU (on two machines
it would not): ``--threads 1`` leaves the engine one core and the hops the other, which shows what the
hops add to the reply's timing rather than what they take from the engine.

The CPU time each serve process spent per token it passed on is read from the process's own CPU clock
(``serve_overhead.CpuUse``: every thread's, ended ones too, to the nanosecond; psutil's 10 ms ticks are
about what a 200-token reply costs): B's over the one-hop replies, and A's (the remote hop: its remote
client reading B's stream and passing it on) over the two-hop replies. Target: at most 60 us per token
(PRODUCT.md).

Each round sends the same prompt down each path in turn (the order alternating, so the machine's load
hits all three), timed the same way on the client as tests/bench/serve_overhead.py times it. The
figures are the median of the paired ratios (and differences, for TTFT) against direct.

    .venv/bin/python tests/bench/remote_overhead.py [--rounds N] [--tokens N] [--threads N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.core.hardware import hardware_from_json
from app.core.launch import LaunchRequest
from app.store.library import Library
from app.store.model_options import ModelOptions, save_model_options
from app.store.settings import Settings, save_settings
from app.supervisor.engine import Engine
from tests.bench.serve_overhead import PROMPTS, CpuUse, Target, Timing, stream
from tests.conftest import profile_path
from tests.support.llama import build_llama_server, fetch_smollm_gguf
from tests.support.serve import Serving, serving

MODEL = "user.smol"
CTX = 4096


def setup_home(home: Path, server_dir: Path, model: Path | None, args: tuple[str, ...]) -> None:
    os.environ["LEMON_DESK_HOME"] = str(home)
    settings = Settings(llama_server_path=str(server_dir / "llama-server"))
    save_settings(settings)
    if model is not None:
        Library(settings).import_path(model, name=MODEL)
        save_model_options({MODEL: ModelOptions(backend="system", ctx_size=CTX, args=" ".join(args))})


def add_remote(home_a: Path, url: str) -> None:
    env = {**os.environ, "LEMON_DESK_HOME": str(home_a)}
    argv = [sys.executable, "-m", "app", "remote", "add", "b", url]
    added = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    if added.returncode != 0 or "reachable" not in added.stdout:
        raise SystemExit(f"remote add failed: {added.stdout}{added.stderr}")


def wait_for_listing(url: str, name: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        data = httpx.get(f"{url}/v1/models", trust_env=False, timeout=30).json()["data"]
        if any(m["id"] == name and m["status"] != "unreachable" for m in data):
            return
        time.sleep(0.1)
    raise SystemExit(f"{url} did not list {name} within {timeout_s:g} s")


async def bench(args: argparse.Namespace, engine: Engine, via_b: Serving, via_a: Serving) -> None:
    direct = Target(engine.base_url, {"Authorization": f"Bearer {engine.api_key}"}, None)
    one_hop = Target(via_b.url, {}, MODEL)
    two_hops = Target(via_a.url, {}, f"@b/{MODEL}")
    # Whose CPU each path's figure is: B's over the one-hop replies, A's over the two-hop ones.
    cpu = {"one hop": CpuUse(via_b.proc.pid), "two hops": CpuUse(via_a.proc.pid)}
    paths = [direct, one_hop, two_hops]
    runs: dict[str, list[Timing]] = {"direct": [], "one hop": [], "two hops": []}
    limits = httpx.Limits(max_connections=None, keepalive_expiry=2.0)
    async with httpx.AsyncClient(trust_env=False, limits=limits) as client:
        for path in paths:  # warm-up (B loads its engine here), not counted
            await stream(client, path, PROMPTS[0], 8)
        for i in range(args.rounds):
            prompt = PROMPTS[i % len(PROMPTS)]
            order = list(zip(runs.items(), paths, strict=True))
            for (label, results), path in order if i % 2 == 0 else reversed(order):
                reply = stream(client, path, prompt, args.tokens)
                results.append(await (cpu[label].over(reply) if label in cpu else reply))

    print(
        f"llama-server, SmolLM2-135M, loopback, engine args {' '.join(engine_args(args))!r}; "
        f"{args.rounds} rounds x {args.tokens} tokens per path; "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    base = runs["direct"]
    for label, timings in runs.items():
        decode = statistics.median(t.decode_tps for t in timings)
        ttft = statistics.median(t.ttft_s for t in timings) * 1000
        line = f"{label:9s} decode {decode:7.2f} tok/s  TTFT {ttft:7.2f} ms"
        if timings is not base:
            ratio = statistics.median(t.decode_tps / d.decode_tps for t, d in zip(timings, base, strict=True))
            extra = statistics.median(t.ttft_s - d.ttft_s for t, d in zip(timings, base, strict=True)) * 1000
            line += f"  decode ratio {ratio:.4f}  TTFT {extra:+.2f} ms (paired medians against direct)"
            whose = "B's serve" if label == "one hop" else "A's serve (the remote hop)"
            per_token = cpu[label].per_token_us()
            line += f"\n          {whose} CPU per token it passed on: {per_token:.1f} us (target <= 60)"
        print(line)


async def run(
    args: argparse.Namespace, server_dir: Path, model: Path, via_b: Serving, via_a: Serving
) -> None:
    hardware = hardware_from_json(json.loads(profile_path("cpu_only_x86").read_text()))
    request = LaunchRequest(
        "llamacpp",
        "cpu",
        str(server_dir / "llama-server"),
        str(server_dir),
        str(model),
        CTX,
        engine_args(args),
    )
    engine = Engine("bench-direct", request, hardware)
    await engine.start()
    try:
        await bench(args, engine, via_b, via_a)
    finally:
        await engine.stop()


def engine_args(args: argparse.Namespace) -> tuple[str, ...]:
    return ("--parallel", "1", *(("-t", str(args.threads)) if args.threads else ()))


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--threads", type=int, default=0, help="engine threads (default: llama-server's)")
    args = parser.parse_args()
    server_dir, model = build_llama_server(print), fetch_smollm_gguf(print)
    os.environ["LEMON_DESK_MOCK_HARDWARE"] = str(profile_path("cpu_only_x86"))
    os.environ["LD_LIBRARY_PATH"] = str(server_dir)
    with tempfile.TemporaryDirectory(prefix="lemon-desk-remote-bench-") as tmp:
        home_a, home_b = Path(tmp) / "a", Path(tmp) / "b"  # each serve's own throwaway app folder
        setup_home(home_b, server_dir, model, engine_args(args))
        setup_home(home_a, server_dir, None, ())
        with serving(env={"LEMON_DESK_HOME": str(home_b)}) as b:
            add_remote(home_a, b.url)
            with serving(env={"LEMON_DESK_HOME": str(home_a)}) as a:
                wait_for_listing(a.url, f"@b/{MODEL}")
                asyncio.run(run(args, server_dir, model, b, a))


if __name__ == "__main__":
    main()
