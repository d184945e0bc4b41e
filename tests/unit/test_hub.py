"""The Hub client against a loopback Hub: file lists, search, errors people can act on, header reads."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
from gguf import GGUFReader

from app.core.errors import ModelError
from app.core.fit import shape_from_gguf
from app.core.gguf import HEADER_FIRST, gguf_metadata
from app.core.refs import parse_ref, select
from app.store.model_paths import local_gguf_metadata
from app.supervisor.hub import HubClient
from app.supervisor.modelmeta import remote_shape
from tests.support.fileserver import Fault, Served, serve
from tests.support.hubserver import HubRepo, LoopbackHub, git_blob_id
from tests.support.modelfiles import gguf_files, mlx_files

T = TypeVar("T")
GGUF = gguf_files("Model-Q4_K_M", layers=3)
MLX = mlx_files()

HUB_EARLY_BREAK = pytest.mark.leaves_running(
    "HubClient.read_range breaks off httpx's aiter_bytes once it has the bytes; httpx's inner generator "
    "is left for the loop's GC hook to close (an aclose() task asyncio.run cancels at exit)"
)


@pytest.fixture(autouse=True)
def repos(hub: LoopbackHub) -> None:
    hub.add(HubRepo("org/Model-GGUF", {"README.md": b"hi", **GGUF}, tags=("gguf",), downloads=7, likes=2))
    hub.add(HubRepo("org/Model-mlx", MLX, tags=("mlx",), downloads=30))
    hub.add(HubRepo("org/Model-pytorch", {"model.bin": b"x"}, tags=("pytorch",), downloads=99))


def with_hub(use: Callable[[HubClient], Awaitable[T]], token: str | None = None) -> T:
    async def go() -> T:
        async with httpx.AsyncClient() as client:
            return await use(HubClient(client, token=token))

    return asyncio.run(go())


def test_listing_has_sizes_checksums_and_the_commit(hub: LoopbackHub) -> None:
    listing = with_hub(lambda h: h.listing("org/Model-GGUF"))
    repo = hub.repos["org/Model-GGUF"]
    assert listing.revision == repo.commit
    by_path = {f.path: f for f in listing.files}
    gguf = by_path["Model-Q4_K_M.gguf"]
    assert (gguf.size, gguf.sha256) == (len(GGUF["Model-Q4_K_M.gguf"]), repo.sha256("Model-Q4_K_M.gguf"))
    readme = by_path["README.md"]
    assert readme.sha256 is None and readme.oid == git_blob_id(b"hi")


def test_search_ranks_by_downloads_and_keeps_what_can_run(hub: LoopbackHub) -> None:
    hits = with_hub(lambda h: h.search("org/model"))
    assert [(h.repo_id, h.recipe) for h in hits] == [
        ("org/Model-mlx", "lemon-mlx"),
        ("org/Model-GGUF", "llamacpp"),
    ]
    only_gguf = with_hub(lambda h: h.search("org/model", "llamacpp"))
    assert [h.repo_id for h in only_gguf] == ["org/Model-GGUF"]
    assert ("/api/models", None) in hub.served.log


@HUB_EARLY_BREAK
def test_errors_say_what_happened_and_what_to_do(hub: LoopbackHub) -> None:
    with pytest.raises(ModelError, match="The repo org/Nope does not exist on the Hugging Face Hub"):
        with_hub(lambda h: h.listing("org/Nope"))
    hub.add(HubRepo("org/Gated", {"a.gguf": GGUF["Model-Q4_K_M.gguf"]}, gated=True))
    for token in (None, "hf_wrong"):
        with pytest.raises(
            ModelError, match=r"org/Gated is gated.*Accept its licence at http.*/org/Gated.*token"
        ):
            with_hub(lambda h: h.read_range("org/Gated", "main", "a.gguf", 0, 16), token=token)
    assert with_hub(lambda h: h.read_range("org/Gated", "main", "a.gguf", 0, 4), token=hub.token) == b"GGUF"
    with pytest.raises(ModelError, match=r"missing\.gguf in org/Gated does not exist"):
        with_hub(lambda h: h.read_range("org/Gated", "main", "missing.gguf", 0, 4), token=hub.token)


def test_an_unreachable_hub_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    with pytest.raises(
        ModelError, match=r"Could not reach the Hugging Face Hub at http://127.0.0.1:9.*HF_ENDPOINT"
    ):
        with_hub(lambda h: h.listing("org/x"))


def test_gguf_shape_from_range_reads_of_the_first_megabytes(hub: LoopbackHub) -> None:
    # A vocabulary big enough that the metadata outgrows the first read.
    big_vocab = gguf_files("Wide-Q8_0", layers=2, vocab=120_000)["Wide-Q8_0.gguf"]
    hub.add(HubRepo("org/Wide-GGUF", {"Wide-Q8_0.gguf": big_vocab}))
    files = with_hub(lambda h: h.listing("org/Wide-GGUF"))
    shape = with_hub(lambda h: remote_shape(h, select(files, parse_ref("org/Wide-GGUF:Q8_0"))))
    assert (shape.architecture, shape.layers, shape.embedding, shape.context_train) == ("llama", 2, 256, 4096)
    assert shape.kv_elements_per_token == 2 * 2 * (2 * 256 // 8)
    ranges = hub.requests_for("org/Wide-GGUF", "Wide-Q8_0.gguf")
    assert ranges[0] == f"bytes=0-{HEADER_FIRST - 1}" and len(ranges) >= 2  # read on, never the whole file
    assert all(r is not None and not r.endswith("-") for r in ranges)


def test_mlx_shape_from_config_json(hub: LoopbackHub) -> None:
    files = with_hub(lambda h: h.listing("org/Model-mlx"))
    shape = with_hub(lambda h: remote_shape(h, select(files, parse_ref("org/Model-mlx"))))
    assert (shape.layers, shape.embedding, shape.kv_elements_per_token) == (2, 64, 2 * 2 * 2 * 16)
    assert hub.requests_for("org/Model-mlx", "config.json") == [None]


def test_metadata_walk_agrees_with_the_gguf_package_reader(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(GGUF["Model-Q4_K_M.gguf"])
    mine = local_gguf_metadata(path)
    reader = GGUFReader(path)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key.startswith("tokenizer."):
            continue
        assert mine[key] == field.contents(), key
    assert shape_from_gguf(mine).layers == 3
    with pytest.raises(ModelError, match="not a GGUF model"):
        gguf_metadata(b"PK\x03\x04" + bytes(60))
    assert json.dumps(mine)  # plain values only


HTTPX_DECODING_ERROR = pytest.mark.leaves_running(
    "httpx raises DecodingError from aiter_bytes with its inner aiter_raw generator unfinished; the loop's "
    "GC hook closes it (an aclose() task asyncio.run cancels at exit)"
)


@HTTPX_DECODING_ERROR
def test_a_hub_answer_that_does_not_decode_is_the_apps_error(hub: LoopbackHub) -> None:
    """A body marked gzip that is not: httpx's DecodingError is no TransportError."""
    listing = "/api/models/org/Model-GGUF"
    hub.served.headers[listing] = {"Content-Encoding": "gzip"}
    with pytest.raises(
        ModelError, match=r"sent an answer the app cannot read \(DecodingError\).*HF_ENDPOINT"
    ):
        with_hub(lambda h: h.listing("org/Model-GGUF"))
    file = LoopbackHub.file_path("org/Model-GGUF", "Model-Q4_K_M.gguf")
    hub.served.headers[file] = {**hub.served.headers[file], "Content-Encoding": "gzip"}
    with pytest.raises(ModelError, match=r"\(DecodingError\)"):
        with_hub(lambda h: h.read_range("org/Model-GGUF", "main", "Model-Q4_K_M.gguf", 0, 16))


def test_a_hub_that_redirects_in_a_loop_is_the_apps_error(hub: LoopbackHub) -> None:
    listing = "/api/models/org/Model-GGUF"
    hub.served.headers[listing] = {"Location": listing}
    for _ in range(30):
        hub.served.arm(listing, Fault(status=302))
    with pytest.raises(ModelError, match=r"sent an answer the app cannot read \(TooManyRedirects\)"):
        with_hub(lambda h: h.listing("org/Model-GGUF"))


REDIRECT_BODY = 64 << 20


def test_a_redirect_is_followed_without_its_body_being_read(hub: LoopbackHub) -> None:
    """The Hub sends a file on to a CDN with a 302; a mirror or proxy whose redirect has a body without
    end (64 MiB here) is followed at once, for a file list and for a file's bytes alike, its body left
    unread: httpx reads a redirect's body whole before following it."""
    listing = "/api/models/org/Model-GGUF"
    file = LoopbackHub.file_path("org/Model-GGUF", "Model-Q4_K_M.gguf")
    for path in (listing, file):
        hub.served.files[f"/cdn{path}"] = hub.served.files[path]
        hub.served.headers[path] = {**hub.served.headers.get(path, {}), "Location": f"/cdn{path}"}
        hub.served.arm(path, Fault(status=302, status_body=REDIRECT_BODY))

    assert with_hub(lambda h: h.listing("org/Model-GGUF")).revision == hub.repos["org/Model-GGUF"].commit
    assert with_hub(lambda h: h.read_range("org/Model-GGUF", "main", "Model-Q4_K_M.gguf", 0, 4)) == b"GGUF"
    sent = {path: written for path, _, written, _ in hub.served.sent if path in (listing, file)}
    assert sent.keys() == {listing, file}
    assert all(isinstance(n, int) and n < REDIRECT_BODY // 8 for n in sent.values()), sent


def test_the_token_follows_a_redirect_within_the_hub_but_not_to_another_host(hub: LoopbackHub) -> None:
    """httpx's rule, kept: Authorization goes on with a redirect to the Hub's own origin (a gated file
    moved there still reads) and is dropped on a redirect to another host."""
    hub.add(HubRepo("org/Gated", {"a.gguf": b"GGUF"}, gated=True))
    file = LoopbackHub.file_path("org/Gated", "a.gguf")
    hub.served.files["/moved/a.gguf"] = b"GGUF"
    hub.served.required_headers["/moved/a.gguf"] = {"Authorization": f"Bearer {hub.token}"}
    elsewhere = Served(files={"/cdn/a.gguf": b"GGUF"})
    with serve(elsewhere) as cdn:
        for location in ("/moved/a.gguf", f"{cdn}/cdn/a.gguf"):
            hub.served.headers[file] = {**hub.served.headers[file], "Location": location}
            hub.served.arm(file, Fault(status=302))
            read = with_hub(lambda h: h.read_range("org/Gated", "main", "a.gguf", 0, 4), token=hub.token)
            assert read == b"GGUF", location
    assert [path for path, _ in elsewhere.log] == ["/cdn/a.gguf"]
    assert elsewhere.authorizations == [None]
