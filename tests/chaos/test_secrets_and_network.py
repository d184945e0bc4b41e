"""Secrets never written where they can leak, and hostile network answers: a redirect to another host
does not carry the HF token, a stalled connection gives up clearly, names that leave the cache and wrong
sizes are refused."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from app.core.errors import LemonDeskError
from app.store.model_options import ModelOptions
from app.store.secrets import set_hf_token
from app.store.settings import Settings
from app.supervisor.hub import MAX_ANSWER_BYTES
from app.supervisor.router import EngineRecovery, Router, RouterEvent
from tests.chaos.conftest import Row
from tests.support.fileserver import Fault, Served, serve
from tests.support.hubserver import HubRepo, LoopbackHub
from tests.support.keychain import private_keychain
from tests.support.modelfiles import gguf_files
from tests.support.standin import control, make_standin_model

HF_TOKEN = "hf_chaosSECRETtoken0123456789"
API_KEY = "ld-chaos-SECRET-api-key-9876543210"


def occurrences(data: bytes) -> int:
    return sum(data.count(secret.encode()) for secret in (HF_TOKEN, API_KEY))


@pytest.mark.chaos("secrets scan (config, logs, argv, env, crash)")
def test_secrets_are_found_nowhere(
    chaos_row: Row,
    standin_settings: Settings,
    tmp_path: Path,
    lemon_home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LEMON_DESK_API_KEY", API_KEY)
    model_path = make_standin_model(tmp_path, "secretive", tokens=20)
    crash_words: list[str] = []
    places: dict[str, int] = {}

    async def go() -> None:
        async with Router(standin_settings) as router:
            await router.hub()  # reads the token from the keychain, as a pull does
            model = router.library.import_path(model_path)
            router.save_options(model.name, ModelOptions(backend="system"))
            engine = await router.load(model.name)
            assert engine.pid is not None
            places["engine argv"] = occurrences(Path(f"/proc/{engine.pid}/cmdline").read_bytes())
            places["engine environment"] = occurrences(Path(f"/proc/{engine.pid}/environ").read_bytes())
            await router.chat(model.name, [{"role": "user", "content": f"my key is not {API_KEY[:3]}"}])

            def seen(event: RouterEvent) -> None:
                if isinstance(event, EngineRecovery):
                    crash_words.append(event.message)

            router.subscribe(seen)
            await control(engine.base_url, "crash")
            while not crash_words:
                await asyncio.sleep(0.01)
            crash_words.append(str(engine.error))
            await router.unload(model.name)

    with private_keychain(tmp_path / "keyrings"):
        set_hf_token(HF_TOKEN)
        asyncio.run(go())
    places["crash output"] = occurrences("\n".join(crash_words).encode())
    files = [p for p in lemon_home.rglob("*") if p.is_file()]
    places[f"{len(files)} files in LEMON_DESK_HOME"] = sum(occurrences(p.read_bytes()) for p in files)
    for place, found in places.items():
        chaos_row.add(f"{place}: {found}")
    chaos_row.lost = "secrets found: " + str(sum(places.values()))
    assert sum(places.values()) == 0, places


# --- hostile networks -------------------------------------------------------------------------------

REPO = "chaos-org/Hostile-GGUF"


async def pull(ref: str, stall_timeout_s: float) -> str:
    """What a pull of ``ref`` ends with: 'ok' or the error the user sees."""
    async with Router(Settings()) as router:
        await router.hub()
        router.downloads().stall_timeout_s = stall_timeout_s
        try:
            await router.pull(ref)
        except LemonDeskError as err:
            return str(err)
    return "ok"


@pytest.mark.chaos("hostile network (Hub)")
def test_hostile_hub_answers(
    chaos_row: Row, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lemon_home: Path
) -> None:
    data = gguf_files("Hostile-Q4_K_M", layers=2, tensor_kib=256)["Hostile-Q4_K_M.gguf"]
    cache = tmp_path / "hub-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    elsewhere = Served()
    with serve(elsewhere) as other_base:
        hub = LoopbackHub(token=HF_TOKEN)
        cases = {
            "name with ../": {"../../../../escape/x-Q4_K_M.gguf": data},
            "absolute name": {"/tmp/escape-Q4_K_M.gguf": data},
            "wrong size": {"Hostile-Q4_K_M.gguf": data},
            "endless body": {"Hostile-Q4_K_M.gguf": data},
            "redirect to another host": {"Hostile-Q4_K_M.gguf": data},
            "stalled connection": {"Hostile-Q4_K_M.gguf": data},
            "a sign-in page for the file list": {"Hostile-Q4_K_M.gguf": data},
        }
        with hub.running() as base:
            monkeypatch.setenv("HF_ENDPOINT", base)
            outcomes: dict[str, str] = {}
            for i, (case, files) in enumerate(cases.items()):
                repo_id = f"{REPO}-{i}"
                repo = HubRepo(repo_id, files, tags=("gguf",))
                if case == "wrong size":
                    repo.declared_sizes["Hostile-Q4_K_M.gguf"] = len(data) - 1000
                hub.add(repo)
                url = hub.file_path(repo_id, "Hostile-Q4_K_M.gguf", repo.commit)
                if case == "endless body":
                    hub.served.files[url] = data + b"\0" * (64 << 20)  # far more than the listing says
                if case == "redirect to another host":
                    hub.served.headers[url] = {"Location": f"{other_base}/stolen"}
                    for _ in range(4):  # a HEAD and GETs, each redirected
                        hub.arm(repo_id, "Hostile-Q4_K_M.gguf", Fault(status=302))
                    elsewhere.files["/stolen"] = data
                if case == "a sign-in page for the file list":
                    hub.served.files[f"/api/models/{repo_id}"] = b"<html>Sign in to the network</html>"
                if case == "stalled connection":
                    for _ in range(2):
                        hub.arm(repo_id, "Hostile-Q4_K_M.gguf", Fault(hold_after=1000))
                began = time.monotonic()
                outcome = asyncio.run(pull(f"{repo_id}:Q4_K_M", stall_timeout_s=1.0))
                took = time.monotonic() - began
                outcomes[case] = outcome
                chaos_row.add(f"{case}: {'pulled' if outcome == 'ok' else 'refused'} in {took:.1f} s")
        assert not (tmp_path / "escape").exists() and not Path("/tmp/escape-Q4_K_M.gguf").exists()
        assert outcomes["name with ../"] != "ok" and outcomes["absolute name"] != "ok"
        assert "is not what the app expects" in outcomes["a sign-in page for the file list"]
        assert "Traceback" not in json.dumps(outcomes)
        assert elsewhere.log, "the redirect was not followed: nothing to check"
        leaked = sum(1 for a in elsewhere.authorizations if a and HF_TOKEN in a)
        chaos_row.add(f"token sent to the other host: {leaked} times")
        assert leaked == 0
    chaos_row.lost = "nothing written outside the cache"
    print(json.dumps(outcomes, indent=1))


@pytest.mark.leaves_running(
    "the file list is left unread past the cap on purpose (it may never end): httpx's aiter_bytes and "
    "aiter_raw stay half-run until the loop's GC hook closes them, an aclose() task asyncio.run cancels"
)
@pytest.mark.chaos("hostile network (Hub): a file list without end")
def test_a_hub_file_list_without_end(
    chaos_row: Row, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lemon_home: Path
) -> None:
    """A mirror or proxy (HF_ENDPOINT) whose file list goes on past the real cap: the pull is refused
    once the app has read that much, and the rest is not sent for."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    hub = LoopbackHub()
    hub.add(HubRepo(REPO, {"Hostile-Q4_K_M.gguf": b"GGUF"}, tags=("gguf",)))
    listing = f"/api/models/{REPO}"
    endless = b'{"siblings": [' + b" " * (MAX_ANSWER_BYTES + (32 << 20))
    hub.served.files[listing] = endless
    hub.served.throttle[listing] = 1 << 30  # sent in pieces, each counted once written
    with hub.running() as base:
        monkeypatch.setenv("HF_ENDPOINT", base)
        began = time.monotonic()
        outcome = asyncio.run(pull(f"{REPO}:Q4_K_M", stall_timeout_s=1.0))
        took = time.monotonic() - began
    ((_, _, sent, _),) = hub.served.sent
    assert isinstance(sent, int)
    chaos_row.add(f"refused in {took:.1f} s" if "went on past 64 MiB" in outcome else outcome)
    chaos_row.worst = f"sent {sent >> 20} MiB of {len(endless) >> 20}"
    chaos_row.lost = "nothing: refused before any download"
    assert "went on past 64 MiB" in outcome and sent < len(endless), (outcome, sent)
    assert not hub.byte_requests()
