"""``lemon-desk serve`` as a real child process (tests/support/serve.py) over the stand-in engine: what it
says in its own words, where the window would say others."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import ollama
import pytest

from app.store.library import Library
from app.store.model_options import ModelOptions, save_model_options
from app.store.settings import Settings, save_settings
from tests.support.serve import serving
from tests.support.standin import make_standin_model


@pytest.fixture
def standin_models(standin_settings: Settings, tmp_path: Path) -> list[str]:
    """Two stand-in models, run by the stand-in engine as the `system` backend, for a child to serve."""
    save_settings(standin_settings)
    library = Library(standin_settings)
    names = [library.import_path(make_standin_model(tmp_path, name)).name for name in ("alpha", "beta")]
    save_model_options({name: ModelOptions(backend="system") for name in names})
    return names


def test_a_load_only_pinned_models_block_says_to_raise_serves_limit(standin_models: list[str]) -> None:
    alpha, beta = standin_models
    with serving("--max-loaded-models", "1") as served, httpx.Client(trust_env=False, timeout=30) as api:
        pinned = api.post(f"{served.url}/api/v1/load", json={"model_name": alpha, "pinned": True})
        refused = api.post(f"{served.url}/api/v1/load", json={"model_name": beta})
    assert pinned.status_code == 200
    error = refused.json()["error"]
    assert refused.status_code == 409 and error["code"] == "model_pinned"
    assert "--max-loaded-models" in error["message"] and "Settings" not in error["message"]


@pytest.mark.parametrize("key", [None, "s3cret-key-0123"])
def test_json_says_where_it_listens_in_one_object_and_never_the_key(key: str | None) -> None:
    env = {"LEMON_DESK_API_KEY": key} if key else {}
    with serving("--json", env=env) as served:
        listening = json.loads(served.line)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        models = httpx.get(f"{listening['openai_url']}models", headers=headers, trust_env=False)
    port = int(served.url.rsplit(":", 1)[1])
    assert listening == {
        "url": f"http://127.0.0.1:{port}",
        "openai_url": f"http://127.0.0.1:{port}/v1/",
        "lemonade_url": f"http://127.0.0.1:{port}/api/v1/",
        "host": "127.0.0.1",
        "port": port,
        "key_required": key is not None,
    }
    assert models.status_code == 200 and (key is None or key not in served.line)


@pytest.mark.parametrize(
    ("host", "said"),
    [
        ("nosuchhost.invalid", "the host name nosuchhost.invalid does not resolve"),
        ("192.0.2.1", "192.0.2.1 is not an address of this machine"),  # TEST-NET-1: no machine's
    ],
)
def test_a_host_it_cannot_listen_on_is_blamed_not_the_port(host: str, said: str) -> None:
    command = [sys.executable, "-m", "app", "serve", "--host", host, "--port", "0", "--api-key", "k"]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 1 and said in refused.stderr, refused.stderr
    assert "--host" in refused.stderr and "port" not in refused.stderr.replace(f"{host}:0", "")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_ollama_port_serves_ollamas_clients_with_only_their_host_set(standin_models: list[str]) -> None:
    port = free_port()
    with serving("--ollama-port", str(port), "--json") as served:
        listening = json.loads(served.line)
        api = ollama.Client(host=f"127.0.0.1:{port}", timeout=30)  # as OLLAMA_HOST is written
        try:
            listed = sorted(m.model or "" for m in api.list().models)
            reply = api.chat(model=standin_models[0], messages=[{"role": "user", "content": "hi"}])
            root = httpx.get(f"http://127.0.0.1:{port}/", trust_env=False)
        finally:
            api.close()
    assert listening["ollama_url"] == f"http://127.0.0.1:{port}" and listening["ollama_port"] == port
    assert listed == sorted(f"{name}:latest" for name in standin_models)
    assert reply.done and reply.message.content
    assert root.text == "Ollama is running"


def test_a_taken_ollama_port_is_refused_saying_who_holds_it(standin_models: list[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "app", "serve", "--port", "0", "--ollama-port", str(port)]
        refused = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    said = refused.stderr
    assert f"could not listen on Ollama's port 127.0.0.1:{port}: the port is taken" in said
    assert f"(pid {os.getpid()})" in said and "--ollama-port" in said  # this test holds it
    assert refused.stdout == ""  # nothing said it listened: it did not answer on either port


def test_ollamas_port_the_same_as_the_apis_is_refused_as_such(standin_models: list[str]) -> None:
    """Not "the port is taken by python (pid of this very serve)": the two ports are the same."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "app", "serve", "--port", str(port), "--ollama-port", str(port)]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert f"Ollama's port cannot be {port}: the local API itself listens there" in refused.stderr
