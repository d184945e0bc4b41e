"""A lemon-mlx release asset whose ``server`` is a STAND-IN, and the HF cache it reads from.

The real lemon-mlx binary cannot be had on this machine (it is built from GitHub sources). The
stand-in accepts lemon-mlx's command line (``server [MODEL] --host H --port P [--ctx-size N] ...``,
unknown flags ignored), behaves like the binary where the app depends on it, and serves with mlx-lm:

- it exits 127 with the loader's message unless ``LD_LIBRARY_PATH`` holds its own folder (the real
  Linux binaries have no RUNPATH and need the bundled libopenblas);
- it resolves a repo id from the HF cache (``HF_HUB_CACHE``, else ``$HF_HOME/hub``) and fails like the
  binary does when given something else that is not a model folder;
- it exits 0 when the port is taken;
- it prints ``[TPS] Prompt: ...`` / ``[TPS] Generation: ...`` lines to stderr after each request;
- it ignores SIGTERM, as the binary may, when a file ``ignore-sigterm`` lies beside it.

Every call is appended to ``calls.jsonl`` beside the script, so a test can see what the app passed.
Everything around it (mirror, download, unpack, launch, client) is the app's real code.
"""

from __future__ import annotations

import io
import json
import shutil
import stat
import zipfile
from pathlib import Path

STANDIN = r'''#!{python}
"""STAND-IN for lemon-mlx's `server` binary (tests only): lemon-mlx's command line, mlx-lm inside."""
import json, os, signal, socket, sys
from pathlib import Path

here = Path(__file__).resolve().parent
if (here / "ignore-sigterm").exists():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
args = sys.argv[1:]
opts, model = {{}}, None
i = 0
while i < len(args):
    a = args[i]
    if a.startswith("--"):
        name, eq, val = a.partition("=")
        if not eq and name not in ("--no-think", "--no-download", "--use-mtp") and i + 1 < len(args):
            val = args[i + 1]
            i += 1
        opts[name] = val
    elif model is None:
        model = a
    i += 1
seen_env = ("LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH", "HF_HOME", "HF_HUB_CACHE")
with open(here / "calls.jsonl", "a") as log:
    log.write(json.dumps({{"argv": sys.argv, "model": model, "opts": opts, "pid": os.getpid(),
                          "env": {{k: os.environ.get(k) for k in seen_env}}}}) + "\n")

if str(here) not in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
    print(f"{{sys.argv[0]}}: error while loading shared libraries: libopenblas.so.0: "
          "cannot open shared object file: No such file or directory", file=sys.stderr)
    sys.exit(127)

host, port = opts.get("--host", "127.0.0.1"), int(opts.get("--port", "8080"))
probe = socket.socket()
probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    probe.bind((host, port))
except OSError:
    print(f"Port {{port}} is already in use", file=sys.stderr)
    sys.exit(0)  # what the real binary does
finally:
    probe.close()

path = Path(model) if model else None
if path is None or not (path / "config.json").is_file():
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(os.environ.get("HF_HOME", ""), "hub")
    repo = Path(hub) / ("models--" + str(model).replace("/", "--"))
    try:
        path = repo / "snapshots" / (repo / "refs" / "main").read_text().strip()
    except OSError:
        print(f"HTTP 404: https://huggingface.co/api/models/{{model}}/revision/main", file=sys.stderr)
        sys.exit(1)

import mlx_lm.server as server

generate = server.stream_generate

def stream_generate_with_tps(*a, **kw):
    last = None
    try:
        for last in generate(*a, **kw):
            yield last
    finally:  # the server stops iterating at the last token: print as the generator closes
        if last is not None:
            print_tps(last)

def print_tps(last):
    for kind, n, tps in (("Prompt", last.prompt_tokens, last.prompt_tps),
                         ("Generation", last.generation_tokens, last.generation_tps)):
        print(f"[TPS] {{kind}}: {{n}} tokens, {{tps:.2f}} tokens/s, {{n / max(tps, 1e-9):.3f}}s",
              file=sys.stderr, flush=True)

server.stream_generate = stream_generate_with_tps
# One request at a time through stream_generate (as lemon-mlx serves), so every request gets its lines.
server.ResponseGenerator._is_batchable = lambda self, args: False
sys.argv = ["server", "--model", str(path), "--host", host, "--port", str(port)]
server.main()
'''

BUNDLED_LIBS = ("libopenblas.so.0", "liblapacke.so.3", "libgfortran.so.5")


def release_zip(python: Path) -> bytes:
    """The ``ubuntu-cpu-x64`` asset's layout: server, chat, diagnose and the bundled libraries."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:

        def add(name: str, text: str, mode: int) -> None:
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFREG | mode) << 16
            zf.writestr(info, text)

        add("server", STANDIN.format(python=python), 0o755)
        for tool in ("chat", "diagnose"):
            add(tool, "#!/bin/sh\necho 'stand-in: not used by the app' >&2\nexit 2\n", 0o755)
        for lib in BUNDLED_LIBS:
            add(lib, "stand-in for a bundled library\n", 0o644)
    return buf.getvalue()


def read_calls(server_folder: Path) -> list[dict[str, object]]:
    log = server_folder / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def lay_out_hf_cache(hub: Path, repo_id: str, model_dir: Path, revision: str = "0" * 40) -> Path:
    """Put ``model_dir`` into the HF cache layout (``models--org--repo/{refs/main,snapshots/REV}``)."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    shutil.copytree(model_dir, snapshot, dirs_exist_ok=True)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot
