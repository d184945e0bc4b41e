"""Hugging Face search with what a person needs to choose: each hit's recipe, its variants with their
sizes and a fit estimate at a context size. One implementation for ``lemon-desk search`` and the
window's Hub search (both reach it through the router).

Every variant of a repo shares one shape (the layers and heads do not change with the quant), so the
header is read once per repo: from the first variant's GGUF (HTTP Range) or the MLX ``config.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from app.core.errors import ModelError
from app.core.fit import FitEstimate, ModelShape, estimate, weights_bytes
from app.core.hardware import Hardware
from app.core.refs import MLX_RECIPE, FileSet, RepoListing, gguf_variants, select_gguf, select_mlx
from app.supervisor.hub import HubClient, SearchHit
from app.supervisor.modelmeta import remote_parameter_count, remote_shape

DESCRIBE_CONCURRENCY = 4


@dataclass(frozen=True)
class HubVariant:
    """One way to download a repo: a GGUF quant (``Q4_K_M``) or the MLX repo whole."""

    name: str
    ref: str  # what ``pull`` and Add take: ``org/repo:VARIANT``, or ``org/repo`` for MLX
    size_bytes: int
    files: tuple[str, ...]
    fit: FitEstimate | None  # None when the header could not be read (``HubResult.error`` says why)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ref": self.ref,
            "size_bytes": self.size_bytes,
            "files": list(self.files),
            "fit": self.fit.to_json() if self.fit else None,
        }


@dataclass(frozen=True)
class HubResult:
    hit: SearchHit
    variants: tuple[HubVariant, ...] = ()
    error: str = ""  # why the repo's files or header could not be read
    fit_error: str = ""  # why there is no fit estimate (the variants are still listed)
    params: int | None = None  # from the weights' headers; the same for every quant of a model

    @property
    def repo_id(self) -> str:
        return self.hit.repo_id

    def to_json(self) -> dict[str, Any]:
        hit = self.hit
        return {
            "repo_id": hit.repo_id,
            "recipe": hit.recipe,
            "downloads": hit.downloads,
            "likes": hit.likes,
            "gated": hit.gated,
            "last_modified": hit.last_modified or None,
            "params": self.params,
            "variants": [v.to_json() for v in self.variants],
            "error": self.error or None,
        }


def variants_of(listing: RepoListing) -> list[FileSet]:
    """Every GGUF quant of a repo, or the MLX repo as one variant."""
    if listing.files and not gguf_variants(listing):
        return [select_mlx(listing)]
    return [select_gguf(listing, label) for label in gguf_variants(listing)]


async def fit_of(
    hub: HubClient, files: FileSet, hw: Hardware, context: int, shape: ModelShape | None = None
) -> tuple[FitEstimate | None, str]:
    """The fit estimate, or None and why not (the Hub may not serve the header, or it may be odd)."""
    try:
        shape = shape or await remote_shape(hub, files)
    except ModelError as err:
        return None, str(err)
    return estimate(weights_bytes(files.files), shape, hw, files.recipe, context), ""


async def describe(
    hub: HubClient, hit: SearchHit, listing: RepoListing | ModelError, hw: Hardware, context: int
) -> HubResult:
    try:
        if isinstance(listing, ModelError):
            raise listing
        variants = variants_of(listing)
    except ModelError as err:
        return HubResult(hit, error=str(err))
    shape: ModelShape | None = None
    fit_error = ""
    params = None
    if variants:
        try:
            shape = await remote_shape(hub, variants[0])
        except ModelError as err:
            fit_error = str(err)
        with contextlib.suppress(ModelError):  # a count is a nicety: none is no error
            params = await remote_parameter_count(hub, variants[0])
    described = []
    for files in variants:
        fit = estimate(weights_bytes(files.files), shape, hw, files.recipe, context) if shape else None
        ref = hit.repo_id if files.recipe == MLX_RECIPE else f"{hit.repo_id}:{files.label}"
        described.append(HubVariant(files.label, ref, files.size, tuple(f.path for f in files.files), fit))
    return HubResult(hit, tuple(described), fit_error=fit_error, params=params)


async def search(
    hub: HubClient, query: str, recipe: str | None, limit: int, hw: Hardware, context: int
) -> list[HubResult]:
    """The hits, most downloaded first, each with its variants and their fit at ``context``."""
    hits = await hub.search(query, recipe, limit)
    listings = await hub.listings([h.repo_id for h in hits])
    gate = asyncio.Semaphore(DESCRIBE_CONCURRENCY)

    async def one(hit: SearchHit, listing: RepoListing | ModelError) -> HubResult:
        async with gate:
            return await describe(hub, hit, listing, hw, context)

    return list(await asyncio.gather(*(one(h, li) for h, li in zip(hits, listings, strict=True))))
