"""The Hugging Face Hub over HTTP: repo file lists, search, and byte ranges of files.

Routes (the same ones ``huggingface_hub`` uses), under ``HF_ENDPOINT`` (default https://huggingface.co):
    GET /api/models/{repo}?blobs=true           files with sizes, git blob ids and LFS SHA-256
    GET /api/models?search=Q&filter=gguf|mlx    search, most downloaded first
    GET /{repo}/resolve/{revision}/{path}       a file's bytes (Range for resume and header reads)
A token (``HF_TOKEN`` or the keychain's) goes in ``Authorization: Bearer``. A repo id (a search hit's
comes from the network) goes into a URL only once it is checked to be one. The JSON answers (a file
list, search results, a repo's JSON file) are read up to ``MAX_ANSWER_BYTES``, and a redirect's body not
at all (``stream_following``): a mirror or proxy gone wrong that answers without end is refused, not held
in memory.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from app.client.capped import read_upto, stream_following
from app.core.errors import HubBusyError, HubUnreachableError, ModelError
from app.core.names import check_listing, check_repo_id
from app.core.numbers import finite
from app.core.refs import GGUF_RECIPE, MLX_RECIPE, RepoFile, RepoListing

if TYPE_CHECKING:
    import httpx

DEFAULT_ENDPOINT = "https://huggingface.co"
TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 15.0
RECIPE_TAGS = {GGUF_RECIPE: "gguf", MLX_RECIPE: "mlx"}
LISTING_CONCURRENCY = 4
# What is read of a JSON answer. The largest are file lists: with blobs=true each file takes about 230
# bytes (name, size, blob id, LFS SHA-256), so a repo of ten thousand files lists in about 2 MB, and one
# of a hundred thousand (few repos hold that many) in about 25 MB; a config or a safetensors index of a
# hundred thousand tensors is under 10 MB.
MAX_ANSWER_BYTES = 64 << 20


def _timeout() -> httpx.Timeout:
    import httpx

    return httpx.Timeout(TIMEOUT_S, connect=CONNECT_TIMEOUT_S)


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


@dataclass(frozen=True)
class SearchHit:
    repo_id: str
    downloads: int
    likes: int
    recipe: str | None  # what runs it: "llamacpp" for GGUF repos, "lemon-mlx" for MLX ones
    gated: bool
    last_modified: str = ""  # ISO 8601, when the Hub says


def gated_error(repo_id: str, endpoint: str, status: int | None = None) -> ModelError:
    what = f"the Hub refused access (HTTP {status})" if status else "its files need a token"
    return ModelError(
        f"{repo_id} is gated: {what}.",
        f"Accept its licence at {endpoint}/{repo_id} while signed in, then add a Hugging Face token "
        "(the app's settings, or HF_TOKEN).",
    )


def missing_error(repo_id: str, path: str | None = None) -> ModelError:
    what = f"{path} in {repo_id}" if path else f"The repo {repo_id}"
    return ModelError(
        f"{what} does not exist on the Hugging Face Hub.",
        "Check the spelling (org/repo:VARIANT); a private repo also needs a token.",
    )


def _repo_path(repo_id: str) -> str:
    """A repo id as a URL's path, once it is one: a search hit's id comes from the network."""
    return quote(check_repo_id(repo_id))


def _count(value: object) -> int:
    """A search hit's downloads or likes; 0 for what is no count (text, a list, Infinity, below 0)."""
    number = finite(value)
    return max(int(number), 0) if number is not None else 0


class HubClient:
    """The Hub's routes above, over one ``httpx.AsyncClient`` that the caller owns."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        endpoint: str | None = None,
        token: str | Callable[[], str | None] | None = None,
    ) -> None:
        """``token``: the token, or what reads it (the keychain), called once, in a thread, when the
        first request needs it: making a client touches no keychain."""
        self.client = client
        self.endpoint = (endpoint or hub_endpoint()).rstrip("/")
        self._token = token

    async def token(self) -> str | None:
        if callable(self._token):
            self._token = await asyncio.to_thread(self._token)
        return self._token

    async def headers(self) -> dict[str, str]:
        token = await self.token()
        return {"Authorization": f"Bearer {token}"} if token else {}

    def file_url(self, repo_id: str, revision: str, path: str) -> str:
        return f"{self.endpoint}/{_repo_path(repo_id)}/resolve/{quote(revision, safe='')}/{quote(path)}"

    def check(self, response: httpx.Response, repo_id: str | None, path: str | None = None) -> None:
        """Turn a failed answer into the error a user can act on."""
        status = response.status_code
        if status < 400:
            return
        asked = f"for {repo_id}" if repo_id else "to a search"
        if status == 429:
            wait = response.headers.get("Retry-After", "")  # seconds; a date is rare, and left out
            when = (
                f"It asks to wait {wait} seconds: try again then."
                if wait.isascii() and wait.isdigit() and len(wait) <= 6
                else "Wait a minute and try again."
            )
            raise HubBusyError(
                f"The Hugging Face Hub at {self.endpoint} asks the app to slow down: it answered HTTP 429 "
                f"(too many requests) {asked}.",
                when,
            )
        if status >= 500:  # the Hub's failure, not the request's
            raise HubUnreachableError(
                f"The Hugging Face Hub at {self.endpoint} answered HTTP {status} {asked}: it failed on "
                "its side.",
                "Try again in a moment (or check HF_ENDPOINT).",
            )
        if repo_id is not None:
            code = response.headers.get("X-Error-Code", "")
            if code in ("RepoNotFound", "EntryNotFound", "RevisionNotFound") or status == 404:
                raise missing_error(repo_id, path if code != "RepoNotFound" else None)
            if status in (401, 403):
                raise gated_error(repo_id, self.endpoint, status)
        raise ModelError(f"The Hugging Face Hub answered HTTP {status} {asked}.", "Try again in a moment.")

    def _unreachable(self, err: httpx.HTTPError) -> HubUnreachableError:
        import httpx

        if isinstance(err, httpx.TransportError):
            what = f"Could not reach the Hugging Face Hub at {self.endpoint}"
        else:  # it answered, but with redirects without end or a body that does not decode
            what = f"The Hugging Face Hub at {self.endpoint} sent an answer the app cannot read"
        return HubUnreachableError(
            f"{what} ({type(err).__name__}).", "Check the connection (or HF_ENDPOINT) and try again."
        )

    async def _get(self, url: str, repo_id: str | None, path: str | None = None, **kw: Any) -> bytes:
        """The body of an answer ``check`` let through, read up to ``MAX_ANSWER_BYTES``."""
        import httpx

        try:
            async with stream_following(
                self.client, "GET", url, headers=await self.headers(), timeout=_timeout(), **kw
            ) as response:
                self.check(response, repo_id, path)
                body = await read_upto(response.aiter_bytes(), MAX_ANSWER_BYTES)
        except httpx.HTTPError as err:
            raise self._unreachable(err) from None
        if len(body) > MAX_ANSWER_BYTES:
            what = (
                f"{path} in {repo_id}" if path else f"the file list of {repo_id}" if repo_id else "a search"
            )
            raise ModelError(
                f"The Hugging Face Hub's answer for {what} went on past {MAX_ANSWER_BYTES >> 20} MiB "
                "and was not read further.",
                f"No real answer is that long: check HF_ENDPOINT (now {self.endpoint}), or try again later.",
            )
        return body

    async def listing(self, repo_id: str) -> RepoListing:
        """The files on the main branch, with sizes and checksums, and the commit they belong to.

        Every name in it has been checked (``app.core.names``): none can lead a path out of the cache.
        """
        url = f"{self.endpoint}/api/models/{_repo_path(repo_id)}"
        body = await self._get(url, repo_id, params={"blobs": "true"})
        try:
            data = json.loads(body)
            files = tuple(
                RepoFile(
                    path=str(s["rfilename"]),
                    size=int((s.get("lfs") or {}).get("size", s.get("size", 0))),
                    sha256=(s.get("lfs") or {}).get("sha256"),
                    blob_id=s.get("blobId"),
                )
                for s in data["siblings"]
            )
            if any(f.size < 0 for f in files):
                raise ValueError("a negative size")  # no file has one: this is no listing to trust
            listing = RepoListing(repo_id, str(data["sha"]), files, gated=bool(data.get("gated")))
        # OverflowError: int() of a size of Infinity (or 1e999, which json reads as Infinity).
        except (KeyError, TypeError, ValueError, OverflowError, AttributeError, RecursionError):
            raise ModelError(
                f"The Hub's file list for {repo_id} is not what the app expects.", "Try again later."
            ) from None
        return check_listing(listing)  # its names become paths in the cache

    async def search(self, query: str, recipe: str | None = None, limit: int = 10) -> list[SearchHit]:
        params: dict[str, Any] = {"search": query, "sort": "downloads", "direction": -1, "limit": limit}
        if recipe:
            params["filter"] = RECIPE_TAGS[recipe]
        body = await self._get(f"{self.endpoint}/api/models", None, params=params)
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            data = None
        if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
            raise ModelError(
                "The Hub's search results are not what the app expects.",
                "Check HF_ENDPOINT (or the network's sign-in page), and try again later.",
            )
        hits = []
        for item in data:
            # One hit's odd fields should not sink the search: unreadable tags or name skip the hit.
            tags = item.get("tags")
            tags = {t for t in tags if isinstance(t, str)} if isinstance(tags, list) else set()
            kind = GGUF_RECIPE if "gguf" in tags else MLX_RECIPE if "mlx" in tags else None
            if kind is None or (recipe and kind != recipe):
                continue  # neither format runs here
            repo_id = item.get("id") or item.get("modelId")
            if not isinstance(repo_id, str):
                continue
            hits.append(
                SearchHit(
                    repo_id,
                    _count(item.get("downloads")),
                    _count(item.get("likes")),
                    kind,
                    bool(item.get("gated")),
                    str(item.get("lastModified") or ""),
                )
            )
        return hits

    async def listings(self, repo_ids: list[str]) -> list[RepoListing | ModelError]:
        """Several repos' file lists, a few at a time; a repo that fails gives its error instead."""
        gate = asyncio.Semaphore(LISTING_CONCURRENCY)

        async def one(repo_id: str) -> RepoListing | ModelError:
            async with gate:
                try:
                    return await self.listing(repo_id)
                except ModelError as err:
                    return err

        return list(await asyncio.gather(*(one(r) for r in repo_ids)))

    async def read_range(self, repo_id: str, revision: str, path: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (exclusive) of a file, or fewer if the file is shorter."""
        import httpx

        headers = {**await self.headers(), "Range": f"bytes={start}-{end - 1}"}
        url = self.file_url(repo_id, revision, path)
        try:
            async with stream_following(
                self.client, "GET", url, headers=headers, timeout=_timeout()
            ) as response:
                self.check(response, repo_id, path)
                skip = start if response.status_code == 200 else 0
                body = bytearray()
                length = response.headers.get("Content-Length", "")
                length = length if length.isascii() and length.isdigit() else ""  # isdigit takes "²"
                if response.status_code == 206 and length and int(length) <= end - start:
                    # The range, and no more: read to its end. A stream left part way is closed later
                    # from another task, which httpcore's connection lock refuses (under qasync it
                    # raised from the finalizer).
                    body += await response.aread()
                else:
                    # A server that ignores Range (or sends more than it was asked for, or will not
                    # say how much) may send the whole file or never stop: stop reading once past ``end``.
                    async for piece in response.aiter_bytes():
                        body += piece
                        if len(body) >= skip + end - start:
                            break
        except httpx.HTTPError as err:
            raise self._unreachable(err) from None
        return bytes(body[skip : skip + end - start])

    async def read_json(self, repo_id: str, revision: str, path: str) -> Any:
        body = await self._get(self.file_url(repo_id, revision, path), repo_id, path)
        try:
            return json.loads(body)
        except (ValueError, RecursionError):
            raise ModelError(f"{path} in {repo_id} is not valid JSON.") from None
