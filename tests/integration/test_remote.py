"""A remote backend for real: two `lemon-desk serve` (real child processes), the second (B, with a key)
serving SmolLM2 on the real llama-server, added to the first's home as the remote `b`. `run @b/user.smol`,
`bench @b/user.smol` and the first instance's local API (the official `openai` client) answer through it;
B stopped, the first says "unreachable" plainly; B back on the same port, it answers again. The
window's chat through a remote is tests/gui/test_remote_ui.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import openai
import pytest

from app.store.library import Library
from app.store.model_options import ModelOptions, save_model_options
from app.store.settings import Settings, save_settings
from tests.conftest import profile_path
from tests.integration.conftest import OpenAIs, engines_of, lemon_desk
from tests.support.keychain import private_keychain
from tests.support.serve import Serving, serving

pytestmark = pytest.mark.integration

MODEL = "user.smol"
ON_B = f"@b/{MODEL}"  # the model as the first instance names it
KEY = "remote-test-key-0123456789"
FRANCE = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s:g} s")
        time.sleep(0.05)


@pytest.fixture
def home_b(
    tmp_path: Path, llama_dir: Path, smol_gguf: Path, lemon_home: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """B's own app folder: SmolLM2 imported as MODEL, run by the real llama-server (`system` backend)."""
    home = tmp_path / "home-b"
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))
    monkeypatch.setenv("LD_LIBRARY_PATH", str(llama_dir))
    monkeypatch.setenv("LEMON_DESK_HOME", str(home))
    settings = Settings(llama_server_path=str(llama_dir / "llama-server"))
    save_settings(settings)
    Library(settings).import_path(smol_gguf, name=MODEL)
    save_model_options({MODEL: ModelOptions(backend="system", ctx_size=2048)})
    monkeypatch.setenv("LEMON_DESK_HOME", str(lemon_home))  # A's, for everything else
    return home


@pytest.fixture
def keychain(tmp_path: Path) -> Iterator[None]:
    """A real keychain; child processes reach it through DBUS_SESSION_BUS_ADDRESS."""
    with private_keychain(tmp_path / "keyrings"):
        yield


def serve_b(home_b: Path, *args: str) -> AbstractContextManager[Serving]:
    return serving(*args, env={"LEMON_DESK_HOME": str(home_b), "LEMON_DESK_API_KEY": KEY})


def add_remote(url: str) -> None:
    """`remote add b URL/v1 --ask-key`, the key on stdin: never on a command line."""
    added = subprocess.run(
        [sys.executable, "-m", "app", "remote", "add", "b", f"{url}/v1", "--ask-key"],
        input=f"{KEY}\n",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith(f"Added the remote b ({url}): reachable (Lemon Desk"), added.stdout
    assert ON_B in added.stdout


def statuses(api_url: str) -> dict[str, str]:
    data = httpx.get(f"{api_url}/v1/models", trust_env=False, timeout=30).json()["data"]
    return {m["id"]: m["status"] for m in data}


def test_run_and_the_local_api_answer_through_a_remote_that_goes_and_comes_back(
    home_b: Path, keychain: None, lemon_home: Path, openai_api: OpenAIs
) -> None:
    with serve_b(home_b) as b:
        port = b.url.rsplit(":", 1)[1]
        add_remote(b.url)
        assert KEY not in (lemon_home / "remotes.json").read_text()

        ran = lemon_desk("run", ON_B, "--prompt", FRANCE[0]["content"], "--json", timeout=300)
        assert ran.returncode == 0, ran.stderr
        result = json.loads(ran.stdout)
        assert result["reply"].strip(), result  # `run` samples as the engine does: the words vary
        telemetry = result["telemetry"]
        assert telemetry["completion_tokens"] > 0 and telemetry["ttft_s"] > 0 and telemetry["decode_tps"] > 0
        assert result["remote_stats"]["output_tokens"] > 0  # B's own figures for the same reply

        benched = lemon_desk(
            "bench", ON_B, "--prompt-tokens", "32", "--gen-tokens", "16", "--repetitions", "2", "--json"
        )
        assert benched.returncode == 0, benched.stderr
        (measured,) = json.loads(benched.stdout)["results"]
        assert (measured["recipe"], measured["backend"]) == ("remote", "b")
        assert measured["gen_tokens"] == 16 and measured["tg_tps"] > 0  # ignore_eos reached B's engine

        listed = lemon_desk("models", "--json", timeout=120)
        rows = {m["name"]: m for m in json.loads(listed.stdout)["models"]}
        assert rows[ON_B]["state"] in ("loaded", "available") and rows[ON_B]["remote"] == "b"

        with serving() as a:
            wait_for(lambda: ON_B in statuses(a.url), 60, f"A listing {ON_B}")
            api = openai_api(a.url)
            reply = api.chat.completions.create(model=ON_B, messages=FRANCE, temperature=0, max_tokens=16)
            assert "Paris" in (reply.choices[0].message.content or "")
            chunks = list(
                api.chat.completions.create(
                    model=ON_B, messages=FRANCE, temperature=0, max_tokens=16, stream=True
                )
            )
            assert "Paris" in "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            stats = httpx.get(f"{a.url}/api/v1/stats", trust_env=False).json()
            assert (stats["model_name"], stats["source"]) == (ON_B, "api") and stats["output_tokens"] > 0

            b.proc.terminate()  # B goes away
            assert b.proc.wait(timeout=60) == 0
            with pytest.raises(openai.APIStatusError) as down:
                api.chat.completions.create(model=ON_B, messages=FRANCE, max_tokens=4)
            assert down.value.status_code == 503
            assert "The remote b cannot be reached" in str(down.value) and "keeps looking" in str(down.value)
            assert statuses(a.url)[ON_B] == "unreachable"
            said = lemon_desk("remote", "list", "--json", timeout=120)
            (remote,) = json.loads(said.stdout)["remotes"]
            assert remote["state"] == "unreachable" and "no answer" in remote["message"]

            with serve_b(home_b, "--port", port):  # B is back, on the same port
                wait_for(lambda: statuses(a.url)[ON_B] != "unreachable", 90, "A seeing b again")
                again = api.chat.completions.create(model=ON_B, messages=FRANCE, temperature=0, max_tokens=16)
                assert "Paris" in (again.choices[0].message.content or "")
        assert engines_of(home_b) == [] and engines_of(lemon_home) == []
    assert os.environ["LEMON_DESK_HOME"] == str(lemon_home)
