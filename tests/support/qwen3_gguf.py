"""The tiny Qwen3 of ``qwen3_model.py`` as a GGUF for llama.cpp: the same weights, the same tokenizer, so
that one base runs on llamacpp and on lemon-mlx (whose b1050-stable exits on llama-shaped models, which
SmolLM2 is) and gives the same known reply (``reply.json`` beside the MLX model) on both.

It is read from the MLX model folder the set-up made (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json``), not made again, so the two cannot drift apart, and
written with the ``gguf`` package as llama.cpp's converter writes a Qwen3:

- architecture ``qwen3``, its hyper-parameters from ``config.json``, all F32;
- the tensors under llama.cpp's names (``gguf``'s own map from the Hugging Face names: ``attn_q_norm``,
  ``attn_k_norm``, ...), unpermuted (Qwen's rotary embedding is llama.cpp's NEOX one, as MLX's
  non-traditional ``RoPE``), the output head its own (``tie_word_embeddings`` is false);
- the tokenizer as byte-level BPE (``gpt2``, pre-tokenizer ``gpt-2``: the regex of the ``tokenizers``
  ByteLevel pre-tokenizer the model was trained with): every token with its type (special added tokens
  control, the other added ones, ``<think>`` and ``</think>``, user-defined: kept in the text, as
  Qwen3's), the merges, ``<|im_end|>`` the end token, ``<|endoftext|>`` the begin (never added) and
  padding token, and the chat template.

The set-up (``python -m tests.support.prepare``, step ``qwen3-gguf``, after ``mlx``) writes it once
under the tests' cache folder, named by a digest of this file and of the MLX model's files, so a change
to either makes a new one; tests find it with ``qwen3_gguf()``.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import MODEL_ARCH, GGUFWriter, LlamaFileType, TokenType, get_tensor_name_map

from tests.support.llama import NotBuilt, cache_dir, made_once
from tests.support.mlx_env import qwen3_mlx_model

INPUTS = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
DTYPES = {"F32": np.float32, "F16": np.float16}


def gguf_path(model: Path) -> Path:
    """Where the GGUF of the MLX model folder ``model`` goes: a digest of this recipe and its inputs."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for name in INPUTS:
        digest.update((model / name).read_bytes())
    return cache_dir() / f"qwen3-test-{digest.hexdigest()[:12]}.gguf"


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The arrays of a safetensors file (an 8-byte header size, a JSON header, the raw data)."""
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    header.pop("__metadata__", None)
    data = raw[8 + size :]
    arrays = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        array = np.frombuffer(data[begin:end], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
        arrays[name] = array.astype(np.float32)
    return arrays


def _tokenizer(writer: GGUFWriter, model: Path) -> None:
    spec = json.loads((model / "tokenizer.json").read_text())
    config = json.loads((model / "tokenizer_config.json").read_text())
    vocab: dict[str, int] = dict(spec["model"]["vocab"])
    added = {t["content"]: t for t in spec["added_tokens"]}
    vocab.update({content: t["id"] for content, t in added.items()})
    tokens = sorted(vocab, key=vocab.__getitem__)
    if [vocab[t] for t in tokens] != list(range(len(tokens))):
        raise RuntimeError(f"{model / 'tokenizer.json'}: the token ids are not 0..{len(tokens) - 1}")

    def kind(token: str) -> TokenType:
        if token not in added:
            return TokenType.NORMAL
        return TokenType.CONTROL if added[token]["special"] else TokenType.USER_DEFINED

    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([kind(t) for t in tokens])
    writer.add_token_merges(merges)
    writer.add_eos_token_id(vocab[config["eos_token"]])
    writer.add_bos_token_id(vocab[config["pad_token"]])  # as Qwen3's GGUFs: <|endoftext|>, never added
    writer.add_pad_token_id(vocab[config["pad_token"]])
    writer.add_add_bos_token(False)
    writer.add_chat_template(config["chat_template"])


def write_gguf(model: Path, path: Path) -> Path:
    """Write the MLX model folder ``model`` as a llama.cpp Qwen3 GGUF at ``path``."""
    config = json.loads((model / "config.json").read_text())
    if config.get("model_type") != "qwen3":
        raise RuntimeError(f"{model} holds a {config.get('model_type')!r} model, not a qwen3 one")
    writer = GGUFWriter(str(path), "qwen3")
    writer.add_name("lemon-desk tiny Qwen3 (set weights, known reply)")
    writer.add_description("The tests' tiny Qwen3 of tests/support/qwen3_model.py, for tests only")
    writer.add_file_type(LlamaFileType.ALL_F32)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_rope_dimension_count(config["head_dim"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    _tokenizer(writer, model)
    names = get_tensor_name_map(MODEL_ARCH.QWEN3, config["num_hidden_layers"])
    for name, array in read_safetensors(model / "model.safetensors").items():
        mapped = names.get_name(name, try_suffixes=(".weight",))
        if mapped is None:
            raise RuntimeError(f"{model / 'model.safetensors'}: no llama.cpp name for the tensor {name}")
        writer.add_tensor(mapped, array)  # numpy's (out, in) is ggml's {in, out}, as llama.cpp reads it
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def make_qwen3_gguf(say: Callable[[str], None]) -> Path:
    """The set-up's step: write the GGUF of the tiny Qwen3 once (a temporary file renamed into place,
    under a lock, as the other made assets are). Needs the MLX model of the ``mlx`` step."""
    model = qwen3_mlx_model()
    path = gguf_path(model)
    saying = f"writing the tiny Qwen3 of {model.name} as a GGUF to {path}"
    return made_once(path, "qwen3-gguf", lambda tmp: write_gguf(model, tmp), say, saying)


def qwen3_gguf() -> Path:
    """The tiny Qwen3 as a GGUF, as the set-up (``python -m tests.support.prepare``) left it."""
    path = gguf_path(qwen3_mlx_model())
    if not path.is_file():
        raise NotBuilt(f"the tiny Qwen3 GGUF is not in {path.parent}")
    return path
