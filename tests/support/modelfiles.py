"""Real model files, small: GGUF written by the ``gguf`` package (one file or real shards), and an MLX
folder (llama config, tokenizer files, safetensors weights split by an index)."""

from __future__ import annotations

import json
import struct
import tempfile
import zlib
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

LAYERS, EMBD, HEADS, KV_HEADS, CONTEXT = 4, 256, 8, 2, 4096


def gguf_files(
    stem: str, *, layers: int = LAYERS, tensor_kib: int = 1024, shards: int = 1, vocab: int = 3000
) -> dict[str, bytes]:
    """A llama-architecture GGUF (``stem.gguf``, or ``stem-0000N-of-0000M.gguf`` shards) with random
    float32 tensors of ``tensor_kib`` KiB each, one per layer."""
    rng = np.random.default_rng(zlib.crc32(stem.encode()))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{stem}.gguf"
        writer = GGUFWriter(path, "llama", split_max_tensors=-(-layers // shards) if shards > 1 else 0)
        writer.add_block_count(layers)
        writer.add_context_length(CONTEXT)
        writer.add_embedding_length(EMBD)
        writer.add_feed_forward_length(4 * EMBD)
        writer.add_head_count(HEADS)
        writer.add_head_count_kv(KV_HEADS)
        writer.add_token_list([f"tok{i}" for i in range(vocab)])  # a vocabulary to walk past
        for layer in range(layers):
            data = rng.standard_normal(tensor_kib * 256, dtype=np.float32)
            writer.add_tensor(f"blk.{layer}.ffn_up.weight", data.reshape(-1, 256))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return {p.name: p.read_bytes() for p in sorted(Path(tmp).glob("*.gguf"))}


def safetensors(tensors: dict[str, tuple[int, int]], seed: int = 0) -> bytes:
    """A safetensors file of random float32 matrices of the given shapes."""
    rng = np.random.default_rng(seed)
    header: dict[str, object] = {}
    blobs = []
    offset = 0
    for name, shape in tensors.items():
        data = rng.standard_normal(shape[0] * shape[1], dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + b"".join(blobs)


MLX_CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "vocab_size": 512,
    "torch_dtype": "float32",
}


def mlx_files(vocab: int = 512, hidden: int = 64) -> dict[str, bytes]:
    """An MLX model repo: config, tokenizer files, two weight shards and their index, plus files an
    MLX engine does not need (README, an image) that a download should leave on the Hub."""
    shard1 = safetensors({"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (1, hidden)}, 1)
    shard2 = safetensors({"lm_head.weight": (vocab, hidden)}, 2)
    index = {
        "metadata": {"total_size": len(shard1) + len(shard2)},
        "weight_map": {
            "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
            "model.norm.weight": "model-00001-of-00002.safetensors",
            "lm_head.weight": "model-00002-of-00002.safetensors",
        },
    }
    tokenizer = {"version": "1.0", "model": {"type": "BPE", "vocab": {f"t{i}": i for i in range(vocab)}}}
    return {
        "config.json": json.dumps(MLX_CONFIG).encode(),
        "tokenizer.json": json.dumps(tokenizer).encode(),
        "tokenizer_config.json": json.dumps({"eos_token": "t1", "chat_template": "{{ messages }}"}).encode(),
        "model.safetensors.index.json": json.dumps(index).encode(),
        "model-00001-of-00002.safetensors": shard1,
        "model-00002-of-00002.safetensors": shard2,
        "README.md": b"# a model card\n",
        "figure.png": b"\x89PNG\r\n\x1a\n" + bytes(64),
    }


def gguf_key(key: str, vtype: int, payload: bytes) -> bytes:
    """One key/value pair of a hand-written GGUF header: the key, its value type, the value's bytes."""
    name = key.encode()
    return struct.pack("<Q", len(name)) + name + struct.pack("<I", vtype) + payload


def gguf_array(itype: int, count: int) -> bytes:
    """An array value's head (its item type and its count); the items follow it."""
    return struct.pack("<IQ", itype, count)


def raw_gguf(*pairs: bytes, tensors: int = 0) -> bytes:
    """A GGUF header written by hand from ``gguf_key`` pairs, for what the ``gguf`` package will not write
    (damaged or hostile values): the magic, version 3, the counts, then the pairs (no tensor infos)."""
    return struct.pack("<4sIQQ", b"GGUF", 3, tensors, len(pairs)) + b"".join(pairs)
