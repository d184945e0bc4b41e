"""``lemon-desk pull`` against a loopback Hub whose file list was tampered with: names that would lead
out of the Hugging Face cache are refused with a clear error before one byte is fetched or written.

Each hostile listing is served together with the bytes at the URL the app would ask for, so without the
checks the pull would go through and write where the name points.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.cli import main
from app.core.errors import ModelError
from app.core.refs import RepoListing
from app.store.hfcache import hub_cache_dir
from app.supervisor import hub as hub_module
from app.supervisor.hub import HubClient
from tests.conftest import profile_path
from tests.support.hubserver import HubRepo, LoopbackHub, git_blob_id
from tests.support.testrepos import big_files

REPO = "hostile-org/Evil-GGUF"
DATA = big_files()["Big-Q8_0.gguf"]
COMMIT = hashlib.sha1(b"evil").hexdigest()
SHA256 = hashlib.sha256(DATA).hexdigest()
# From snapshots/<commit>/, four levels up is the test's tmp folder, beside the cache: outside it.
CLIMB = "../../../../outside/x-Q4_K_M.gguf"


def serve_listing(hub: LoopbackHub, path: str, commit: str = COMMIT, **entry: Any) -> None:
    """A one-file listing, and the file's bytes where the app would fetch them."""
    sibling = {"rfilename": path, "size": len(DATA), "blobId": git_blob_id(DATA)}
    sibling["lfs"] = {"sha256": SHA256, "size": len(DATA)}
    sibling.update(entry)
    listing = {"id": REPO, "sha": commit, "siblings": [sibling]}
    hub.served.files[f"/api/models/{REPO}"] = json.dumps(listing).encode()
    url = HubClient(httpx.AsyncClient(), endpoint="http://hub").file_url(REPO, commit, path)
    hub.served.files[httpx.URL(url).path] = DATA  # the path as sent, dot segments and all


HOSTILE: dict[str, dict[str, Any]] = {
    "file name climbs out": {"path": CLIMB},
    "absolute file name": {"path": "{tmp}/outside/x-Q4_K_M.gguf"},
    "backslash file name": {"path": "..\\..\\x-Q4_K_M.gguf"},
    "revision climbs out": {"path": "x-Q4_K_M.gguf", "commit": "../../../outside"},
    "sha256 climbs out": {"path": "x-Q4_K_M.gguf", "lfs": {"sha256": "../../../outside", "size": len(DATA)}},
    # Without an LFS entry the git blob id names the blob.
    "blob id climbs out": {"path": "x-Q4_K_M.gguf", "lfs": None, "blobId": "../../../outside"},
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_pull_refuses_a_listing_whose_names_leave_the_cache(
    hub: LoopbackHub,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
) -> None:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))
    listing = dict(HOSTILE[case])
    listing["path"] = listing["path"].replace("{tmp}", str(tmp_path))
    serve_listing(hub, **listing)

    code = main(["pull", f"{REPO}:Q4_K_M"])
    out, err = capsys.readouterr()

    assert code == 1 and "Traceback" not in err and "is ready" not in out
    assert err.startswith(f"error: The Hub's file list for {REPO} is not safe to use:"), err
    assert "Nothing was downloaded" in err and "check HF_ENDPOINT" in err
    assert not hub.byte_requests()  # refused from the listing alone
    # Nothing outside the app's home and the cache, and nothing in the cache either.
    assert {p.name for p in tmp_path.iterdir()} <= {"lemon-home", "hf-cache"}
    cache = hub_cache_dir()
    assert not cache.exists() or [p for p in cache.rglob("*") if not p.is_dir()] == []


def test_a_safe_listing_with_the_same_bytes_pulls(
    hub: LoopbackHub, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: served the same way, a plain name downloads, so the refusals above are the checks'."""
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))
    serve_listing(hub, "sub/x-Q4_K_M.gguf")
    assert main(["pull", f"{REPO}:Q4_K_M"]) == 0
    out, _ = capsys.readouterr()
    ready = Path(out.strip().splitlines()[-1].split("is ready: ")[1])
    assert ready.read_bytes() == DATA and ready.is_relative_to(hub_cache_dir())


UNREADABLE = {
    "a web page": b"<html><body>Sign in to the network to go on</body></html>",
    "nested too deep for the parser": b"[" * 100_000 + b"]" * 100_000,
    "a list, not an object": b"[1, 2, 3]",
}


@pytest.mark.parametrize("case", list(UNREADABLE))
def test_a_hub_answer_that_is_not_its_json_is_an_error_not_a_traceback(
    hub: LoopbackHub, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """What a captive portal, a proxy's page or a broken mirror answers with 200, for a pull and a search."""
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))
    hub.served.files[f"/api/models/{REPO}"] = UNREADABLE[case]
    hub.served.routes["/api/models"] = lambda _query: UNREADABLE[case]

    assert main(["pull", f"{REPO}:Q4_K_M"]) == 1
    _, err = capsys.readouterr()
    assert "Traceback" not in err
    assert err.startswith(f"error: The Hub's file list for {REPO} is not what the app expects"), err
    assert not hub.byte_requests()

    assert main(["search", "smol"]) == 1
    _, err = capsys.readouterr()
    assert "Traceback" not in err
    assert err.startswith("error: The Hub's search results are not what the app expects"), err


ODD_SIZES: dict[str, Any] = {
    "an infinite size": float("inf"),  # json writes Infinity; 1e999 reads back as the same
    "a negative size": -5,
}


@pytest.mark.parametrize("case", list(ODD_SIZES))
def test_a_listing_with_a_size_no_file_has_is_refused(
    hub: LoopbackHub, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))
    serve_listing(hub, "x-Q4_K_M.gguf", lfs={"sha256": SHA256, "size": ODD_SIZES[case]})

    assert main(["pull", f"{REPO}:Q4_K_M"]) == 1
    _, err = capsys.readouterr()
    assert "Traceback" not in err
    assert err.startswith(f"error: The Hub's file list for {REPO} is not what the app expects"), err
    assert not hub.byte_requests()


def test_search_hits_with_unreadable_fields_count_0_or_are_skipped(hub: LoopbackHub) -> None:
    """One odd hit must not sink a search: counts that are no numbers are 0, a hit without readable
    tags or name is left out (it cannot be told to run here)."""
    found = [
        {"id": "org/text-GGUF", "tags": ["gguf"], "downloads": "lots", "likes": [1]},
        {"id": "org/inf-GGUF", "tags": ["gguf"], "downloads": float("inf"), "likes": -3},
        {"id": "org/nested-GGUF", "tags": [["x"], "gguf"], "downloads": 12},
        {"id": "org/huge-GGUF", "tags": ["gguf"], "downloads": 10**400, "likes": 7},  # past any float
        {"id": "org/number-tags", "tags": 5},
        {"id": ["org/list-id"], "tags": ["gguf"]},
    ]
    hub.served.routes["/api/models"] = lambda _query: json.dumps(found).encode()

    async def search() -> list[tuple[str, int, int]]:
        async with httpx.AsyncClient() as client:
            return [(h.repo_id, h.downloads, h.likes) for h in await HubClient(client).search("org")]

    assert asyncio.run(search()) == [
        ("org/text-GGUF", 0, 0),
        ("org/inf-GGUF", 0, 0),
        ("org/nested-GGUF", 12, 0),
        ("org/huge-GGUF", 0, 7),
    ]


RULE = "A repository id is owner/name, in letters, digits, '-', '_' and '.'."
NO_REPO_IDS = [
    "../../api/whoami-v2",  # climbs to another route of the Hub, token and all
    "org/name?expand[]=x",  # a query of its own
    "org/name/tree/main",  # a third segment
    "org/..",
    "org",
    "/org/name",
    "org/na me",
    "org/mödel",  # the Hub's ids are ASCII
]


def test_search_hits_whose_ids_are_no_repo_ids_are_refused_before_any_url_is_made(hub: LoopbackHub) -> None:
    """A search hit's id goes into the URL of its file list: one that is no Hub repo id is that hit's
    ModelError, and the Hub is not asked for it; a good hit beside them is listed as ever."""
    hub.add(HubRepo("org/fine-GGUF", {"fine-Q4_0.gguf": b"GGUF"}, tags=("gguf",)))
    hits = [{"id": repo_id, "tags": ["gguf"]} for repo_id in [*NO_REPO_IDS, "org/fine-GGUF"]]
    hub.served.routes["/api/models"] = lambda _query: json.dumps(hits).encode()

    async def search_and_list() -> list[RepoListing | ModelError]:
        async with httpx.AsyncClient() as client:
            hub_client = HubClient(client)
            found = await hub_client.search("org")
            return await hub_client.listings([hit.repo_id for hit in found])

    *refused, fine = asyncio.run(search_and_list())
    assert isinstance(fine, RepoListing) and fine.repo_id == "org/fine-GGUF"
    said = [str(err) if isinstance(err, ModelError) else err for err in refused]
    assert said == [f"{repo_id!r} is not a Hugging Face repository id. {RULE}" for repo_id in NO_REPO_IDS]
    assert [path for path, _ in hub.served.log] == ["/api/models", "/api/models/org/fine-GGUF"]


# Where each JSON answer is served, what the app asks of it, and how its error names it.
ENDLESS: dict[str, tuple[str, Callable[[HubClient], Awaitable[object]], str]] = {
    "a file list": (f"/api/models/{REPO}", lambda h: h.listing(REPO), f"the file list of {REPO}"),
    "search results": ("/api/models", lambda h: h.search("evil"), "a search"),
    "a JSON file": (
        LoopbackHub.file_path(REPO, "config.json"),
        lambda h: h.read_json(REPO, "main", "config.json"),
        f"config.json in {REPO}",
    ),
}


@pytest.mark.leaves_running(
    "the answer is left unread past the cap on purpose (it may never end): httpx's aiter_bytes and "
    "aiter_raw stay half-run until the loop's GC hook closes them, an aclose() task asyncio.run cancels"
)
@pytest.mark.parametrize("case", list(ENDLESS))
def test_a_hub_answer_without_end_is_refused_past_the_cap_not_read_into_memory(
    hub: LoopbackHub, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """A Hub, mirror or proxy (HF_ENDPOINT) whose JSON answer goes on and on: the app stops reading once
    past the cap and says so, with what to do. The cap is 1 MiB here, the answer 32 times that."""
    monkeypatch.setattr(hub_module, "MAX_ANSWER_BYTES", 1 << 20)
    path, ask, what = ENDLESS[case]
    answer = b'{"sha": "' + b"0" * (32 << 20)  # a string that never closes
    if path in hub.served.routes:
        hub.served.routes[path] = lambda _query: answer
    else:
        hub.served.files[path] = answer
    hub.served.throttle[path] = 1 << 30  # in pieces, each counted once written

    async def go() -> object:
        async with httpx.AsyncClient() as client:
            return await ask(HubClient(client))

    began = time.monotonic()
    with pytest.raises(ModelError) as refused:
        asyncio.run(go())
    assert time.monotonic() - began < 10
    said = f"The Hugging Face Hub's answer for {what} went on past 1 MiB and was not read further."
    assert refused.value.message == said
    assert "check HF_ENDPOINT" in refused.value.hint
    ((_, _, sent, _),) = hub.served.sent
    assert isinstance(sent, int) and sent < len(answer) // 2, sent
