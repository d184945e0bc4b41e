"""The tests' set-up: build or fetch, once, everything the suite runs for real, before pytest starts.

    python -m tests.support.prepare [--only STEP,...]

``tests/run`` runs it first. Each step is cached under
``platformdirs.user_cache_dir("lemon-desk-tests")`` and takes no time once done; a first run builds
llama-server (10-15 minutes on two cores), the mlx-lm venv (about a minute), the real lemon-mlx engine
where its pinned sources are at hand (8-20 minutes) and the packaged app (about three minutes); the made
vision projector and the tiny Qwen3's GGUF take a second each. A build is set-up, not a test: none
runs under a test's timeout, and tests only find what is here (``NotBuilt`` says to run this when it is
not). Every step says what it does, one line at a time, and how long it took; a step that fails says
why, and the steps after it still run, so one failure does not hide another. Exit 1 when any step
failed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from tests.support.bundle import build_bundle
from tests.support.lemon_mlx_engine import build_lemon_mlx_engine
from tests.support.llama import BuildFailed, build_llama_server, fetch_smollm_gguf
from tests.support.mlx_env import build_mlx
from tests.support.projector import make_projector
from tests.support.qwen3_gguf import make_qwen3_gguf

Step = Callable[[Callable[[str], None]], object]

STEPS: dict[str, tuple[str, Step]] = {
    "llama-server": ("llama-server, its RPC worker and llama-bench", build_llama_server),
    "smollm": ("the SmolLM2-135M test model", fetch_smollm_gguf),
    "projector": ("a vision projector for SmolLM2, made with random weights", make_projector),
    "mlx": ("the mlx-lm venv and the tiny MLX model", build_mlx),
    "qwen3-gguf": ("the tiny Qwen3 as a GGUF, for llama.cpp (from the mlx step's model)", make_qwen3_gguf),
    "lemon-mlx-engine": (
        "the real lemon-mlx engine, where its pinned sources are at hand",
        build_lemon_mlx_engine,
    ),
    "bundle": ("the packaged app", build_bundle),
}


def say(line: str) -> None:
    print(f"[set-up]   {line}", flush=True)


def prepare(names: list[str]) -> bool:
    """Run the named steps in order; True when every one ended well."""
    failed = []
    started = time.monotonic()
    for number, name in enumerate(names, 1):
        what, step = STEPS[name]
        print(f"[set-up {number}/{len(names)}] {what}", flush=True)
        began = time.monotonic()
        try:
            found = step(say)
        except (BuildFailed, OSError, RuntimeError) as error:
            failed.append(name)
            print(f"[set-up]   FAILED after {time.monotonic() - began:.0f} s: {error}", flush=True)
            continue
        if found is not None:
            print(f"[set-up]   ready in {time.monotonic() - began:.0f} s: {found}", flush=True)
    total = time.monotonic() - started
    if failed:
        print(
            f"[set-up] {', '.join(failed)} failed ({total:.0f} s); the tests that need them will fail",
            flush=True,
        )
    else:
        print(f"[set-up] done in {total:.0f} s", flush=True)
    return not failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.prepare", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--only", help=f"a comma-separated list of steps: {', '.join(STEPS)}")
    args = parser.parse_args(argv)
    names = args.only.split(",") if args.only else list(STEPS)
    unknown = [name for name in names if name not in STEPS]
    if unknown:
        parser.error(f"no step {', '.join(unknown)}; the steps are {', '.join(STEPS)}")
    return 0 if prepare(names) else 1


if __name__ == "__main__":
    sys.exit(main())
