"""Remote backends against a stand-in remote on loopback (tests/support/remote_standin.py) that goes down
and comes back on the same port: the watcher's states (one event and one log line per move, backoff,
recovery), keys, the router's chat through a remote, the local API routing to it, and the CLI.
Seconds, not minutes; two real `lemon-desk serve` are in tests/integration/test_remote.py."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from app.cli import main
from app.client import chat as chat_client
from app.client import remote as remote_http
from app.client.events import ChatDelta, ChatDone
from app.client.splice import EngineAnswer, open_stream, splice
from app.core.errors import ConfigError, LemonDeskError, ModelError, RemoteError, RequestError
from app.core.remotes import RemoteKind, RemoteModelStatus, RemoteState
from app.store import secrets
from app.store.settings import Settings
from app.supervisor import remotes as remotes_module
from app.supervisor.api import ApiServer
from app.supervisor.api import openai as openai_routes
from app.supervisor.remote_views import RemoteChanged
from app.supervisor.remotes import Remotes
from app.supervisor.router import RequestFinished, Router, RouterEvent
from tests.support.fileserver import Served, serve
from tests.support.keychain import private_keychain
from tests.support.remote_standin import REPLY, StandinRemote
from tests.support.waiting import until

T = TypeVar("T")
HI = [{"role": "user", "content": "hi"}]
KEY = "remote-key-0123456789"
FAST = {"poll_s": 0.05, "backoff_s": (0.02, 0.05)}


@pytest.fixture
def keychain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("LEMON_DESK_REMOTE_API_KEY", raising=False)
    with private_keychain(tmp_path / "keyrings"):
        yield


def with_router(body: Callable[[Router, StandinRemote], Awaitable[T]], **standin: Any) -> T:
    """A router with the stand-in remote ``box`` added, watched quickly; both stopped after ``body``."""

    async def go() -> T:
        remote = StandinRemote(**standin)
        await remote.start()
        try:
            async with Router(Settings()) as router:
                router.remotes.poll_s, router.remotes.backoff_s = FAST["poll_s"], FAST["backoff_s"]
                await router.remotes.add("box", f"{remote.url}/v1", standin.get("key"))
                router.remotes.watch()
                return await body(router, remote)
        finally:
            await remote.stop()

    return asyncio.run(go())


# --- the watcher ---------------------------------------------------------------------------------------


def test_one_event_and_one_log_line_per_move_and_the_remote_comes_back(
    lemon_home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="app.supervisor.remotes")

    async def go() -> list[RemoteChanged]:
        standin = StandinRemote(models=("smol", "tiny"))
        await standin.start()
        events: list[RemoteChanged] = []
        remotes = Remotes(events.append, **FAST)  # type: ignore[arg-type]
        try:
            added = await remotes.add("box", f"{standin.url}/api/v1/", None)
            assert added.url == standin.url and added.state is RemoteState.REACHABLE
            assert (added.kind, added.version) == (RemoteKind.LEMON_DESK, "9.9.9")
            assert [v.name for v in remotes.views()] == ["@box/smol", "@box/tiny"]
            assert {v.status for v in remotes.views()} == {RemoteModelStatus.AVAILABLE}
            remotes.watch()
            await standin.stop()
            await until(lambda: remotes.snapshot("box").state is RemoteState.UNREACHABLE)
            inside = remotes._remotes["box"]
            await until(lambda: inside.failures >= 5)  # it keeps looking, with backoff, saying nothing new
            down = remotes.snapshot("box")
            assert "no answer" in down.message and down.text.startswith("unreachable since ")
            assert [v.status for v in remotes.views()] == [RemoteModelStatus.UNREACHABLE] * 2  # kept, marked
            await standin.start()  # back, on the same port
            await until(lambda: remotes.snapshot("box").state is RemoteState.REACHABLE)
            assert inside.failures == 0
        finally:
            await remotes.close()
            await standin.stop()
        return events

    events = asyncio.run(go())
    moves = [(e.old, e.state) for e in events if e.moved]
    assert moves == [
        (RemoteState.UNKNOWN, RemoteState.REACHABLE),
        (RemoteState.REACHABLE, RemoteState.UNREACHABLE),
        (RemoteState.UNREACHABLE, RemoteState.REACHABLE),
    ]
    lines = [r.getMessage() for r in caplog.records if r.name == "app.supervisor.remotes"]
    assert sum("is unreachable" in line for line in lines) == 1, lines
    assert sum("is reachable" in line for line in lines) == 2, lines


def test_a_remote_added_or_removed_by_another_process_is_taken_in_while_watching(lemon_home: Path) -> None:
    """`lemon-desk remote add` and `rm` in a terminal reach a running window or `serve` (each its own
    ``Remotes`` over the same file), without a restart."""

    async def go() -> tuple[list[str], list[RemoteChanged], list[str]]:
        standin = StandinRemote(models=("smol",))
        await standin.start()
        events: list[RemoteChanged] = []
        running = Remotes(events.append, file_poll_s=0.05, **FAST)  # type: ignore[arg-type]
        terminal = Remotes(lambda _e: None, **FAST)  # type: ignore[arg-type]
        try:
            running.watch()
            await terminal.add("box", standin.url, None)
            await until(lambda: running.names() == ["box"])
            await until(lambda: running.snapshot("box").state is RemoteState.REACHABLE)
            seen = [v.name for v in running.views()]
            await terminal.remove("box")
            await until(lambda: running.names() == [])
            await running.add("own", standin.url, None)  # its own add is not taken in twice
            await asyncio.sleep(0.2)
            return seen, events, running.names()
        finally:
            await running.close()
            await terminal.close()
            await standin.stop()

    seen, events, left = asyncio.run(go())
    assert seen == ["@box/smol"] and left == ["own"]
    assert [(e.name, e.removed) for e in events if e.removed or e.old is e.state is RemoteState.UNKNOWN] == [
        ("box", False),
        ("box", True),
        ("own", False),
    ]


def test_a_remotes_file_made_unreadable_elsewhere_takes_no_remote_away(lemon_home: Path) -> None:
    async def go() -> list[str]:
        running = Remotes(lambda _e: None, file_poll_s=0.02, backoff_s=(5.0,))
        running.watch()
        try:
            await running.add("box", "http://127.0.0.1:9", None)
            for hostile in ('{"remotes": {"../etc": {"url": "http://x"}}}', "not json", "[" * 100_000):
                staged = lemon_home / "remotes.json.new"
                staged.write_text(hostile)
                staged.replace(lemon_home / "remotes.json")  # as another process writes it
                await asyncio.sleep(0.2)  # several looks: at the file, then at what setting it aside left
            return running.names()
        finally:
            await running.close()

    assert asyncio.run(go()) == ["box"]
    assert len(list(lemon_home.glob("remotes.json.corrupt-*"))) == 3  # each kept, as the store keeps them


def test_the_backoff_grows_while_down_and_resets_once_back(lemon_home: Path) -> None:
    remotes = Remotes(lambda _e: None, poll_s=15.0, backoff_s=(2.0, 5.0, 10.0, 30.0))
    inside = type("R", (), {"state": RemoteState.UNREACHABLE, "failures": 0})()
    delays = []
    for failures in range(1, 7):
        inside.failures = failures
        delays.append(remotes._delay(inside))  # type: ignore[arg-type]
    assert delays == [2.0, 5.0, 10.0, 30.0, 30.0, 30.0]
    inside.state = RemoteState.REACHABLE
    assert remotes._delay(inside) == 15.0  # type: ignore[arg-type]


def test_a_remote_that_wants_a_key_is_refused_until_given_one_kept_in_the_keychain(
    keychain: None, lemon_home: Path
) -> None:
    async def go() -> None:
        standin = StandinRemote(key=KEY)
        await standin.start()
        remotes = Remotes(lambda _e: None, **FAST)  # type: ignore[arg-type]
        try:
            keyless = await remotes.add("open", standin.url, None)
            assert keyless.state is RemoteState.REFUSED and "asks for an API key" in keyless.message
            with pytest.raises(RemoteError) as err:
                async with remotes.client("@open/smol"):
                    pass
            assert "--ask-key" in str(err.value) and err.value.status == 401
            keyed = await remotes.add("box", standin.url, KEY)
            assert keyed.state is RemoteState.REACHABLE and keyed.has_key
            assert standin.seen[-1].authorization == f"Bearer {KEY}"
            assert secrets.get_remote_key("box") == KEY
            assert KEY not in (lemon_home / "remotes.json").read_text()
        finally:
            await remotes.close()
        # A new start reads the key from the keychain.
        again = Remotes(lambda _e: None)
        try:
            (box,) = await again.refresh(["box"])
            assert box.state is RemoteState.REACHABLE
            await again.remove("box")
            assert secrets.get_remote_key("box") is None and again.names() == ["open"]
        finally:
            await again.close()
            await standin.stop()

    asyncio.run(go())


def test_the_window_hears_a_remote_is_gone_only_once_its_key_is_gone(
    keychain: None, lemon_home: Path
) -> None:
    """The removal is told after the key's deletion (a window that looked at the keychain on hearing it
    found the key still there, and a read racing the deletion raised from the Secret Service library)."""
    keys_when_told: list[str | None] = []

    def heard(event: RemoteChanged) -> None:
        if event.removed:
            keys_when_told.append(secrets.get_remote_key(event.name))

    async def go() -> None:
        remotes = Remotes(heard, **FAST)  # type: ignore[arg-type]
        try:
            await remotes.add("box", "http://127.0.0.1:9", KEY)  # nothing listens: kept all the same
            assert secrets.get_remote_key("box") == KEY
            await remotes.remove("box")
        finally:
            await remotes.close()

    asyncio.run(go())
    assert keys_when_told == [None]


def test_a_failed_request_is_explained_by_a_look_begun_after_it(
    lemon_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reply that breaks is explained by a look at the remote begun after it broke: one under way since
    before (the watcher's) saw the remote up, and the failure was then said as the engine's own (a 502)
    rather than the remote's being down (a 503). Probes here are the test's: up, up (held until the
    reply has broken), then down."""
    calls: list[int] = []
    second_began, reply_broke = asyncio.Event(), asyncio.Event()

    async def probe(_pool: httpx.AsyncClient, _key: str | None) -> remote_http.Probe:
        calls.append(len(calls) + 1)
        if len(calls) == 2:
            second_began.set()
            await reply_broke.wait()
        if len(calls) <= 2:
            return remote_http.Probe(RemoteState.REACHABLE, models=())
        return remote_http.Probe(RemoteState.UNREACHABLE, "connection refused")

    monkeypatch.setattr(remote_http, "probe", probe)

    async def go() -> LemonDeskError:
        remotes = Remotes(lambda _e: None, **FAST)  # type: ignore[arg-type]
        try:
            await remotes.add("box", "http://127.0.0.1:9", None)
            box = remotes._remotes["box"]
            watchers_look = asyncio.ensure_future(remotes.look(box))
            await second_began.wait()
            broken = RequestError("The connection to the engine broke (ReadError).")
            explained = asyncio.ensure_future(remotes_module._Observer(remotes, box).explain(broken))
            await asyncio.sleep(0.05)
            reply_broke.set()
            await watchers_look
            return await explained
        finally:
            await remotes.close()

    said = asyncio.run(go())
    assert isinstance(said, RemoteError) and "cannot be reached" in said.message, said
    assert calls == [1, 2, 3]


def test_adding_twice_or_a_bad_name_or_address_is_refused_and_nothing_kept(lemon_home: Path) -> None:
    async def go() -> None:
        remotes = Remotes(lambda _e: None)
        try:
            down = await remotes.add("box", "http://127.0.0.1:9", None)  # nothing listens: kept anyway
            assert down.state is RemoteState.UNREACHABLE
            with pytest.raises(ConfigError, match="already a remote named box"):
                await remotes.add("box", "http://127.0.0.1:9", None)
            with pytest.raises(ConfigError, match="cannot name a remote"):
                await remotes.add("a/b", "http://127.0.0.1:9", None)
            with pytest.raises(ConfigError, match="not an http"):
                await remotes.add("other", "127.0.0.1:9", None)
            with pytest.raises(ModelError, match="no remote named 'nope'"):
                await remotes.remove("nope")
            assert remotes.names() == ["box"]
        finally:
            await remotes.close()

    asyncio.run(go())


# --- the router: chat, load, unload --------------------------------------------------------------------


def test_the_routers_chat_goes_to_the_remote_with_telemetry_measured_here(lemon_home: Path) -> None:
    async def body(router: Router, remote: StandinRemote) -> None:
        events: list[RouterEvent] = []
        router.subscribe(events.append)
        deltas: list[str] = []
        done: ChatDone | None = None
        async for event in router.stream_chat("@box/smol", HI, max_tokens=8):
            if isinstance(event, ChatDelta):
                deltas.append(event.content)
            else:
                done = event
        assert "".join(deltas) == "".join(REPLY) and done is not None
        assert done.telemetry.completion_tokens == len(REPLY) and done.telemetry.ttft_s > 0
        sent = remote.requests("/v1/chat/completions")[-1].body
        assert sent is not None and sent["model"] == "smol" and sent["max_tokens"] == 8
        finished = [e for e in events if isinstance(e, RequestFinished)]
        assert [e.model for e in finished] == ["@box/smol"]
        assert router.last_request is not None and router.last_request.model == "@box/smol"
        whole = await router.chat("@box/smol", HI)
        assert whole.content == "".join(REPLY)
        card = router.run_card("@box/smol", {"temperature": 0.5}, whole.telemetry)
        assert card.recipe == "llamacpp" and "box at http://127.0.0.1:" in card.backend
        assert "Lemon Desk 9.9.9" in card.engine_version and card.sampling == {"temperature": 0.5}

        await router.remotes.load("@box/smol")
        view = router.remotes.model("@box/smol")
        assert "smol" in remote.loaded and view is not None and view.status is RemoteModelStatus.LOADED
        await router.unload("@box/smol")
        assert "smol" not in remote.loaded
        assert [s.body for s in remote.requests("/api/v1/unload")] == [{"model_name": "smol"}]
        assert (await router.remotes.stats("@box/smol") or {}).get("tokens_per_second") == 123.0

        with pytest.raises(ModelError, match="no remote named 'other'"):
            await router.chat("@other/smol", HI)

    with_router(body)


def test_a_remote_down_is_a_clear_error_and_the_first_request_after_it_is_back_answers(
    lemon_home: Path,
) -> None:
    async def body(router: Router, remote: StandinRemote) -> None:
        router.remotes.poll_s, router.remotes.backoff_s = 3600.0, (3600.0,)  # only requests look
        await remote.stop()
        with pytest.raises(RemoteError) as err:
            await router.chat("@box/smol", HI)
        said = str(err.value)
        assert said.startswith("The remote box cannot be reached at http://127.0.0.1:")
        assert "keeps looking" in said and err.value.remote == "box"
        assert router.remotes.snapshot("box").state is RemoteState.UNREACHABLE
        await remote.start()
        reply = await router.chat("@box/smol", HI)  # looks first: no wait for the watcher
        assert reply.content == "".join(REPLY)
        assert router.remotes.snapshot("box").state is RemoteState.REACHABLE

    with_router(body)


def test_a_plain_openai_server_has_no_load_to_call(lemon_home: Path) -> None:
    async def body(router: Router, remote: StandinRemote) -> None:
        assert router.remotes.snapshot("box").kind is RemoteKind.OPENAI
        await router.remotes.load("@box/smol")
        await router.unload("@box/smol")
        assert not remote.requests("/api/v1/load") and not remote.requests("/api/v1/unload")
        assert await router.remotes.stats("@box/smol") is None
        assert (await router.chat("@box/smol", HI)).content == "".join(REPLY)

    with_router(body, kind="openai")


# --- the local API -------------------------------------------------------------------------------------


def test_the_local_api_lists_remote_models_and_routes_to_them(lemon_home: Path) -> None:
    async def body(router: Router, remote: StandinRemote) -> None:
        server = ApiServer(router, "127.0.0.1", 0)
        await server.start()
        try:
            async with httpx.AsyncClient(base_url=server.url, trust_env=False, timeout=30) as api:
                listed = (await api.get("/v1/models")).json()["data"]
                (entry,) = [m for m in listed if m["id"] == "@box/smol"]
                assert (entry["status"], entry["remote"], entry["recipe"]) == ("available", "box", "llamacpp")
                assert (await api.get("/api/v1/models/@box/smol")).json()["id"] == "@box/smol"
                chat = {"model": "@box/smol", "messages": HI}
                whole = await api.post("/v1/chat/completions", json=chat)
                assert whole.status_code == 200 and whole.json()["choices"][0]["message"]["content"]
                streamed = await api.post("/api/v1/chat/completions", json={**chat, "stream": True})
                assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
                assert remote.requests("/v1/chat/completions")[-1].body["model"] == "smol"  # type: ignore[index]
                stats = (await api.get("/api/v1/stats")).json()
                assert (stats["model_name"], stats["source"]) == ("@box/smol", "api")
                assert (await api.post("/api/v1/load", json={"model_name": "@box/smol"})).status_code == 200
                assert "smol" in remote.loaded
                assert (await api.post("/api/v1/unload", json={"model_name": "@box/smol"})).status_code == 200
                assert "smol" not in remote.loaded
                unknown = await api.post("/v1/chat/completions", json={**chat, "model": "@nope/smol"})
                assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
                delete = await api.post("/api/v1/delete", json={"model_name": "@box/smol"})
                assert delete.status_code == 400 and delete.json()["error"]["code"] == "remote_model"
                await remote.stop()
                down = await api.post("/v1/chat/completions", json=chat)
                assert down.status_code == 503 and down.json()["error"]["code"] == "remote_unavailable"
                assert "cannot be reached" in down.json()["error"]["message"]
                listed = (await api.get("/v1/models")).json()["data"]
                assert [m["status"] for m in listed if m["id"] == "@box/smol"] == ["unreachable"]
        finally:
            await server.stop()

    with_router(body)


def test_the_reasoning_a_request_wants_of_a_remote_model_is_asked_in_words_the_remote_reads(
    lemon_home: Path,
) -> None:
    """The remote here puts its thought inside the content unless asked for it apart (a Lemon Desk whose
    model option says "inline"): an Anthropic client still gets a thinking block, an OpenAI client the
    reasoning_format it names (checked here, in the remote's words there), or the remote's own way."""

    async def body(router: Router, remote: StandinRemote) -> dict[str, Any]:
        server = ApiServer(router, "127.0.0.1", 0)
        await server.start()
        got: dict[str, Any] = {}
        try:
            async with httpx.AsyncClient(base_url=server.url, trust_env=False, timeout=30) as api:
                message = {"model": "@box/smol", "max_tokens": 20, "messages": HI}
                blocks = (await api.post("/v1/messages", json=message)).json()["content"]
                got["anthropic"] = [(b["type"], b.get("thinking") or b.get("text")) for b in blocks]
                for fmt in (None, "hidden", "inline", "deepseek", "bogus"):
                    chat = {"model": "@box/smol", "messages": HI, "reasoning_format": fmt}
                    answer = await api.post("/v1/chat/completions", json=chat)
                    choice = answer.json()["choices"][0] if answer.status_code == 200 else answer.json()
                    got[fmt] = (answer.status_code, choice.get("message") or choice["error"]["code"])
                got["asked"] = [s.body and s.body.get("reasoning_format") for s in remote.seen if s.body]
        finally:
            await server.stop()
        return got

    got = with_router(body, thought="Let me see.")
    said = "".join(REPLY)
    assert got["anthropic"] == [("thinking", "Let me see."), ("text", said)]
    assert got[None] == (200, {"role": "assistant", "content": f"<think>Let me see.</think>{said}"})
    assert got["hidden"] == (200, {"role": "assistant", "content": said})
    assert got["inline"] == got[None]
    separate = {"role": "assistant", "content": said, "reasoning_content": "Let me see."}
    assert got["deepseek"] == (200, separate)
    assert got["bogus"] == (400, "invalid_reasoning_format")  # the remote was not asked
    assert got["asked"] == ["auto", None, "auto", "none", "auto"]


async def streamed_through_api(router: Router) -> tuple[httpx.Response, dict[str, Any]]:
    """A streamed chat with ``@box/smol`` through the local API, and the API's stats after it."""
    server = ApiServer(router, "127.0.0.1", 0)
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url, trust_env=False, timeout=30) as api:
            chat = {"model": "@box/smol", "messages": HI, "stream": True}
            streamed = await api.post("/v1/chat/completions", json=chat)
            return streamed, (await api.get("/api/v1/stats")).json()
    finally:
        await server.stop()


def test_a_remote_over_plain_http_streams_through_the_relay_thread_as_a_local_engine_does(
    lemon_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The remote hop: the API passes a remote's stream on from the splice's thread (one read and one
    write a frame), not from its loop per token, and counts it the same."""
    spliced: list[int] = []

    async def spy(answer: EngineAnswer, *args: Any, **kwargs: Any) -> bool:
        spliced.append(answer.status)
        return await splice(answer, *args, **kwargs)

    monkeypatch.setattr(openai_routes, "splice", spy)

    async def body(router: Router, remote: StandinRemote) -> None:
        streamed, stats = await streamed_through_api(router)
        assert spliced == [200]
        assert "".join(REPLY) == "".join(
            json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            for line in streamed.text.splitlines()
            if line.startswith("data: {")
        )
        assert streamed.text.rstrip().endswith("data: [DONE]")
        assert (stats["model_name"], stats["output_tokens"]) == ("@box/smol", len(REPLY))

    with_router(body)


def test_a_remote_named_by_host_name_streams_to_the_window_from_a_socket(
    lemon_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``http://localhost:PORT``: the window's client looks the name up and reads the stream from a socket
    of its own, a frame at a time, as it reads a local engine's."""
    opened: list[tuple[str, int]] = []

    async def spy(address: tuple[str, int], *args: Any) -> EngineAnswer:
        opened.append(address)
        return await open_stream(address, *args)

    monkeypatch.setattr(chat_client, "open_stream", spy)

    async def go() -> str:
        remote = StandinRemote()
        await remote.start()
        try:
            async with Router(Settings()) as router:
                await router.remotes.add("box", f"http://localhost:{remote.port}/v1", None)
                text = ""
                async for event in router.stream_chat("@box/smol", HI, max_tokens=8):
                    text += event.content if isinstance(event, ChatDelta) else ""
                return text
        finally:
            await remote.stop()

    assert asyncio.run(go()) == "".join(REPLY)
    assert [host for host, _ in opened] == ["localhost"]


def test_a_remote_stream_whose_figures_are_too_deep_to_read_still_reaches_the_client(
    lemon_home: Path,
) -> None:
    """The API reads the usage of the streams it passes on; a remote's that no parser can read (nested
    too deep) is left unread: the client gets the whole stream, and the request counts without it."""

    async def body(router: Router, remote: StandinRemote) -> None:
        streamed, stats = await streamed_through_api(router)
        assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
        assert "".join(REPLY) == "".join(
            json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            for line in streamed.text.splitlines()
            if line.startswith("data: {") and "[[[" not in line
        )
        assert (stats["model_name"], stats["output_tokens"]) == ("@box/smol", len(REPLY))

    with_router(body, usage_json="[" * 100_000 + "]" * 100_000)


def test_a_bug_met_mid_stream_ends_the_stream_with_an_error_event_not_a_broken_response(
    lemon_home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Once a stream's headers are out, an error response would land inside its body (the client sees
    garbage where a chunk should be); a failure of the app's own then ends the stream as any failure does."""

    def broken(self: object, chunk: bytes) -> None:
        raise RuntimeError("a bug in the watch")

    monkeypatch.setattr(openai_routes._Watch, "feed", broken)

    async def body(router: Router, remote: StandinRemote) -> None:
        streamed, _ = await streamed_through_api(router)
        events = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: ")]
        assert streamed.status_code == 200 and events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["message"] == "The server failed on this request; see its log."

    with_router(body)
    assert "a bug in the watch" in caplog.text  # the traceback is in the log


# --- the command ---------------------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_remote_add_list_models_run_and_rm_from_the_command(
    keychain: None, lemon_home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    standin = StandinRemote(key=KEY)
    with standin.in_thread():
        monkeypatch.setenv("LEMON_DESK_REMOTE_API_KEY", KEY)  # not on the command line
        code, out, err = run(capsys, "remote", "add", "box", f"{standin.url}/v1")
        assert code == 0, err
        assert out.startswith(
            f"Added the remote box ({standin.url}): reachable (Lemon Desk 9.9.9): @box/smol"
        )
        monkeypatch.delenv("LEMON_DESK_REMOTE_API_KEY")
        assert KEY not in (lemon_home / "remotes.json").read_text()

        code, out, _ = run(capsys, "remote", "list", "--json")
        (listed,) = json.loads(out)["remotes"]
        assert (listed["name"], listed["state"], listed["key"]) == ("box", "reachable", True)
        assert listed["models"] == ["smol"]

        code, out, _ = run(capsys, "models", "--json")
        rows = {m["name"]: m for m in json.loads(out)["models"]}
        assert rows["@box/smol"]["state"] == "available" and rows["@box/smol"]["remote"] == "box"
        code, out, _ = run(capsys, "models")
        assert "@box/smol" in out and f"on box ({standin.url})" in out

        code, out, err = run(capsys, "run", "@box/smol", "--prompt", "hi", "--json")
        assert code == 0, err
        result = json.loads(out)
        assert result["reply"] == "".join(REPLY) and result["model"] == "@box/smol"
        assert result["telemetry"]["completion_tokens"] == len(REPLY)
        assert result["remote_stats"]["tokens_per_second"] == 123.0
        assert standin.requests("/api/v1/load")[-1].body == {"model_name": "smol"}

        code, _, err = run(capsys, "run", "@box/smol", "--prompt", "hi", "--backend", "llamacpp:cpu")
        assert code == 1 and err.startswith("error: --backend, --ctx-size") and "Traceback" not in err
        code, _, err = run(capsys, "remote", "add", "box", standin.url)
        assert code == 1 and err.startswith("error: There is already a remote named box")
        code, _, err = run(capsys, "remote", "add", "x y", standin.url)
        assert code == 1 and "cannot name a remote" in err

        code, out, _ = run(capsys, "remote", "rm", "box")
        assert code == 0 and secrets.get_remote_key("box") is None
        code, _, err = run(capsys, "remote", "rm", "box")
        assert code == 1 and err.startswith("error: There is no remote named 'box'.")
        code, out, _ = run(capsys, "remote")
        assert out.startswith("No remotes.")


def test_run_chats_with_a_remote_model_in_the_terminal(
    lemon_home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    standin = StandinRemote()
    with standin.in_thread():
        assert run(capsys, "remote", "add", "box", standin.url)[0] == 0
        monkeypatch.setattr("sys.stdin", io.StringIO("hi\nand again?\n"))  # two turns, then Ctrl-D
        code, out, err = run(capsys, "run", "@box/smol")
        chats = [seen.body for seen in standin.requests("/v1/chat/completions")]
    assert code == 0, err
    assert "Chatting with @box/smol" in err and out.count("".join(REPLY)) == 2
    assert chats[1] is not None and [m["content"] for m in chats[1]["messages"]] == [
        "hi",
        "".join(REPLY),
        "and again?",
    ]  # the second turn carries the first


def test_an_unreachable_remote_is_shown_as_such_by_list_and_models(
    lemon_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "remote", "add", "gone", "http://127.0.0.1:9")
    assert code == 0 and "kept all the same" in err
    code, out, _ = run(capsys, "remote", "list")
    assert "gone" in out and "unreachable" in out and "no answer" in out
    code, out, _ = run(capsys, "models")
    assert "remote gone (http://127.0.0.1:9) is unreachable: no answer" in out
    code, _, err = run(capsys, "run", "@gone/smol", "--prompt", "hi")
    assert code == 1 and "Traceback" not in err
    assert err.splitlines()[-1].startswith("error: The remote gone cannot be reached at http://127.0.0.1:9")


def test_a_command_says_a_remote_is_unreachable_once(lemon_home: Path) -> None:
    """As real commands (no test logging in the way): the look's log line came out on stderr beside the
    command's own line, so `remote add`, `remote list` and `models` said "unreachable" two or three times."""
    env = {**os.environ, "PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring"}

    def said(*argv: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "app", *argv], capture_output=True, text=True, env=env, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return done.stdout + done.stderr

    added = said("remote", "add", "gone", "http://127.0.0.1:9")
    assert added.count("unreachable") == 1 and added.count("no answer") == 1, added
    listed = said("remote", "list")
    assert listed.count("unreachable") == 1 and listed.count("no answer") == 1, listed
    models = said("models")
    assert models.count("unreachable") == 1, models


def test_bench_measures_a_remote_model_through_its_replies(
    lemon_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    standin = StandinRemote()
    with standin.in_thread():
        assert run(capsys, "remote", "add", "box", standin.url)[0] == 0
        argv = ("bench", "@box/smol", "--prompt-tokens", "16", "--gen-tokens", "4", "--repetitions", "2")
        code, out, err = run(capsys, *argv, "--json")
        assert code == 0, err
        (result,) = json.loads(out)["results"]
        assert (result["model"], result["recipe"], result["backend"]) == ("@box/smol", "remote", "box")
        assert result["repetitions"] == 2 and result["engine_version"] == "Lemon Desk 9.9.9"
        measured = [s.body for s in standin.requests("/v1/chat/completions")][1:]  # after the warm-up
        assert all(b and b["ignore_eos"] is True and b["max_tokens"] == 4 for b in measured), measured
        # It was not loaded there before the bench: loaded for it, unloaded after.
        assert standin.requests("/api/v1/load") and standin.requests("/api/v1/unload")
        assert not standin.loaded


# The endless answer is cut by its size, whatever the time it takes to read 8 MiB (60 s of deadline: a
# machine ten times slower reads them well within it); the dripping one by the look's deadline.
@pytest.mark.parametrize(
    "listing,said,deadline_s",
    [("endless", "went on past 8 MiB", 60.0), ("drip", "did not answer within 1 s", 1.0)],
)
def test_a_remote_whose_answer_never_ends_is_unreachable_not_a_hang(
    lemon_home: Path, listing: str, said: str, deadline_s: float
) -> None:
    async def go() -> None:
        standin = StandinRemote(listing=listing)
        await standin.start()
        remotes = Remotes(lambda _e: None, look_deadline_s=deadline_s)
        try:
            found = await remotes.add("box", standin.url, None)
            assert found.state is RemoteState.UNREACHABLE and said in found.message, found.message
        finally:
            await remotes.close()
            await standin.stop()

    asyncio.run(go())


@pytest.mark.leaves_running(
    "the answer is left unread past the cap on purpose (it may never end): httpx's aiter_bytes and "
    "aiter_raw stay half-run until the loop's GC hook closes them, an aclose() task asyncio.run cancels"
)
@pytest.mark.parametrize("status", [200, 500])
@pytest.mark.parametrize("verb", ["load", "unload"])
def test_a_remote_whose_answer_to_a_load_never_ends_is_a_clear_error_not_held_in_memory(
    verb: str, status: int
) -> None:
    """A remote that answers a load (or unload) with a body without end, as a success or as a refusal:
    the load fails saying so once the answer passes the cap, and the rest is not read."""
    sent = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal sent
        while sent < 64:  # 64 MiB at most, far past the cap: the client stops reading long before
            sent += 1
            yield b"x" * (1 << 20)

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=endless())

    async def go() -> None:
        async with httpx.AsyncClient(base_url="http://box", transport=httpx.MockTransport(answer)) as http:
            await getattr(remote_http, verb)(http, None, "smol", 5.0)

    with pytest.raises(RequestError, match=f"The remote's answer to the {verb} of smol went on past 8 MiB"):
        asyncio.run(go())
    assert sent < 64


@pytest.mark.leaves_running(
    "httpx raises DecodingError from aiter_bytes with its inner aiter_raw generator unfinished; the loop's "
    "GC hook closes it (an aclose() task asyncio.run cancels at exit)"
)
def test_a_remote_whose_answers_do_not_decode_is_unreachable_not_a_logged_traceback(
    lemon_home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Bodies marked gzip that are not: httpx's DecodingError is no TransportError, and must not reach
    the watcher's catch-all (which logs a traceback) nor escape a load or the stats."""
    garbled = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    served = Served(files={"/v1/models": b"{}", "/api/v1/stats": b"{}"})
    served.headers = {"/v1/models": garbled, "/api/v1/stats": garbled}

    async def go(base: str) -> None:
        remotes = Remotes(lambda _e: None)
        try:
            found = await remotes.add("box", base, None)
            assert found.state is RemoteState.UNREACHABLE, found
            assert "an answer it could not read (DecodingError" in found.message, found.message
        finally:
            await remotes.close()
        async with remote_http.connection_pool(base) as http:
            assert await remote_http.stats(http, None) is None

    with caplog.at_level(logging.ERROR), serve(served) as base:
        asyncio.run(go(base))
    assert not [r for r in caplog.records if r.exc_info], caplog.text

    # The load is a POST, which the file server does not take: the same answer from a transport.
    def garbled_answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"not gzip", headers=garbled)

    async def load() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(garbled_answer)) as http:
            await remote_http.load(http, None, "smol", 5.0)

    with pytest.raises(RequestError, match=r"answer to the load could not be read \(DecodingError"):
        asyncio.run(load())
