"""A stand-in for the Hugging Face Hub on loopback: the routes the app uses, over the fault-injecting
file server (``fileserver.py``), so cuts, stalls, wrong bytes and gated repos are real HTTP.

    GET /api/models/{repo}[?blobs=true]      siblings with size, blobId and lfs.sha256, the commit sha
    GET /api/models?search=&filter=&limit=   search, most downloaded first
    GET /{repo}/resolve/{main|commit}/{path} the bytes, with Range
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from tests.support.fileserver import Fault, Served, serve

LFS_SUFFIXES = (".gguf", ".safetensors", ".png")


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class HubRepo:
    repo_id: str
    files: dict[str, bytes]
    tags: tuple[str, ...] = ()
    downloads: int = 0
    likes: int = 0
    gated: bool = False  # the files need ``Authorization: Bearer <token>``
    declared_sizes: dict[str, int] = field(
        default_factory=dict
    )  # sizes the API claims instead of the real ones

    @property
    def commit(self) -> str:
        digest = hashlib.sha1(self.repo_id.encode())
        for path in sorted(self.files):
            digest.update(path.encode() + hashlib.sha256(self.files[path]).digest())
        return digest.hexdigest()

    def sha256(self, path: str) -> str:
        return hashlib.sha256(self.files[path]).hexdigest()

    def info(self) -> dict[str, object]:
        siblings = []
        for path, data in sorted(self.files.items()):
            size = self.declared_sizes.get(path, len(data))
            entry: dict[str, object] = {"rfilename": path, "size": size, "blobId": git_blob_id(data)}
            if path.endswith(LFS_SUFFIXES):
                entry["lfs"] = {"sha256": self.sha256(path), "size": size, "pointerSize": 134}
            siblings.append(entry)
        return {
            "id": self.repo_id,
            "sha": self.commit,
            "gated": "manual" if self.gated else False,
            "downloads": self.downloads,
            "likes": self.likes,
            "tags": list(self.tags),
            "siblings": siblings,
        }


class LoopbackHub:
    """Repos served the way the Hub serves them; ``served.log`` records every request."""

    def __init__(self, token: str = "hf_test_token") -> None:
        self.token = token
        self.served = Served()
        self.repos: dict[str, HubRepo] = {}
        self.served.routes["/api/models"] = self._search

    def add(self, repo: HubRepo) -> HubRepo:
        self.repos[repo.repo_id] = repo
        self.served.files[f"/api/models/{repo.repo_id}"] = json.dumps(repo.info()).encode()
        for path, data in repo.files.items():
            lfs = path.endswith(LFS_SUFFIXES)
            etag = {
                "X-Linked-Etag" if lfs else "ETag": f'"{repo.sha256(path) if lfs else git_blob_id(data)}"'
            }
            for revision in ("main", repo.commit):
                url = self.file_path(repo.repo_id, path, revision)
                self.served.files[url] = data
                self.served.headers[url] = {"X-Repo-Commit": repo.commit, **etag}
                if repo.gated:
                    self.served.required_headers[url] = {"Authorization": f"Bearer {self.token}"}
        return repo

    @staticmethod
    def file_path(repo_id: str, path: str, revision: str = "main") -> str:
        return f"/{repo_id}/resolve/{revision}/{path}"

    def arm(self, repo_id: str, path: str, fault: Fault) -> None:
        """A fault for the next download of ``path`` (by commit, the way the app asks for files)."""
        self.served.arm(self.file_path(repo_id, path, self.repos[repo_id].commit), fault)

    def requests_for(self, repo_id: str, path: str) -> list[str | None]:
        """The Range header of every request for a file's bytes, in order."""
        wanted = {self.file_path(repo_id, path, rev) for rev in ("main", self.repos[repo_id].commit)}
        return [rng for p, rng in self.served.log if p in wanted]

    def byte_requests(self) -> list[str]:
        """Paths of every request for a file (HEAD or GET)."""
        return [p for p, _ in self.served.log if "/resolve/" in p]

    def _search(self, query: dict[str, list[str]]) -> bytes:
        text = query.get("search", [""])[0].lower()
        tag = query.get("filter", [None])[0]
        limit = int(query.get("limit", ["20"])[0])
        found = [
            r for r in self.repos.values() if text in r.repo_id.lower() and (tag is None or tag in r.tags)
        ]
        found.sort(key=lambda r: r.downloads, reverse=True)
        return json.dumps(
            [
                {
                    "id": r.repo_id,
                    "modelId": r.repo_id,
                    "downloads": r.downloads,
                    "likes": r.likes,
                    "tags": list(r.tags),
                    "gated": "manual" if r.gated else False,
                }
                for r in found[:limit]
            ]
        ).encode()

    @contextmanager
    def running(self) -> Iterator[str]:
        with serve(self.served) as base:
            yield base
