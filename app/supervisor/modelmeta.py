"""A model's shape and parameter count before it is downloaded: GGUF metadata and tensor infos from the
file's first megabytes (HTTP Range), ``config.json`` and safetensors headers for MLX. The header walks
themselves are ``app.core.gguf`` and ``app.core.params``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from app.core.errors import ModelError
from app.core.fit import ModelShape, shape_from_config, shape_from_gguf
from app.core.gguf import GrowingRead, gguf_metadata, gguf_parameter_count
from app.core.params import safetensors_header_length, safetensors_parameter_count
from app.core.refs import GGUF_RECIPE, FileSet, RepoFile
from app.supervisor.hub import HubClient

T = TypeVar("T")


async def remote_gguf_metadata(
    hub: HubClient, repo_id: str, revision: str, path: str, size: int
) -> dict[str, Any]:
    """Read the first megabyte of a file on the Hub, then more (doubling) until the metadata is whole."""
    return await _remote_gguf(hub, repo_id, revision, path, size, gguf_metadata)


async def _remote_gguf(
    hub: HubClient, repo_id: str, revision: str, path: str, size: int, parse: Callable[[bytes], T]
) -> T:
    read = GrowingRead(parse, f"{repo_id}/{path}", size)
    data = b""
    while True:
        data += await hub.read_range(repo_id, revision, path, len(data), read.want)
        found = await asyncio.to_thread(read.take, data)  # a large vocabulary takes a while
        if found is not None:
            return found


def weight_files(files: FileSet) -> list[RepoFile]:
    """The files whose tensors are the model's: GGUF shards (not the vision projector) or safetensors."""
    suffix = ".gguf" if files.recipe == GGUF_RECIPE else ".safetensors"
    return [f for f in files.files if f.path.lower().endswith(suffix) and f.path != files.mmproj]


async def remote_parameter_count(hub: HubClient, files: FileSet) -> int:
    """The model's parameters, summed over its weight files' headers, read with Range requests."""
    total = 0
    for f in weight_files(files):
        if files.recipe == GGUF_RECIPE:
            total += await _remote_gguf(
                hub, files.repo_id, files.revision, f.path, f.size, gguf_parameter_count
            )
            continue
        length = safetensors_header_length(
            await hub.read_range(files.repo_id, files.revision, f.path, 0, 8), f.size
        )
        header = await hub.read_range(files.repo_id, files.revision, f.path, 8, 8 + length)
        total += safetensors_parameter_count(header)
    if not total:
        raise ModelError(f"{files.repo_id} has no weight files whose headers give a parameter count.")
    return total


async def remote_shape(hub: HubClient, files: FileSet) -> ModelShape:
    """The shape of the model ``files`` make up, read from the Hub without downloading the weights."""
    if files.recipe == GGUF_RECIPE and files.main is not None:
        main = next(f for f in files.files if f.path == files.main)
        return shape_from_gguf(
            await remote_gguf_metadata(hub, files.repo_id, files.revision, main.path, main.size)
        )
    config = await hub.read_json(files.repo_id, files.revision, "config.json")
    if not isinstance(config, dict):
        raise ModelError(f"config.json in {files.repo_id} is not a JSON object.")
    return shape_from_config(config)
