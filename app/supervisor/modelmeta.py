"""A model's shape before it is downloaded: GGUF metadata from the file's first megabytes (HTTP Range),
or ``config.json`` for MLX. The header walk itself is ``app.core.gguf``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from app.core.errors import ModelError
from app.core.fit import ModelShape, shape_from_config, shape_from_gguf
from app.core.gguf import HEADER_FIRST, HEADER_MAX, HeaderCutShort, gguf_metadata, header_too_big
from app.core.refs import GGUF_RECIPE, FileSet
from app.supervisor.hub import HubClient


async def remote_gguf_metadata(
    hub: HubClient, repo_id: str, revision: str, path: str, size: int
) -> dict[str, Any]:
    """Read the first megabyte of a file on the Hub, then more (doubling) until the metadata is whole."""
    data = b""
    want = min(HEADER_FIRST, size)
    while True:
        data += await hub.read_range(repo_id, revision, path, len(data), want)
        try:
            return await asyncio.to_thread(gguf_metadata, data)  # a large vocabulary takes a while
        except HeaderCutShort:
            if want >= min(size, HEADER_MAX) or len(data) < want:
                raise header_too_big(f"{repo_id}/{path}") from None
            want = min(want * 2, size, HEADER_MAX)


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
