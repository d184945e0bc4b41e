"""A tiny but real MLX model directory: BPE tokenizer, chat template, llama config, random weights.

mlx-lm serves it (gibberish text, real tokens, real SSE). Run this file with a Python that has
``tokenizers``, ``safetensors`` and ``numpy`` (the cached mlx-lm test venv has them):
``python tests/support/mlx_model.py OUT_DIR``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HIDDEN = 64
LAYERS = 2
HEADS = 4
INTERMEDIATE = 128
VOCAB = 256

SENTENCES = [
    "Hello there, how are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "Local models run on your own machine.",
    "A lemon is a yellow citrus fruit.",
    "Tell me a short story about a robot.",
    "The answer is forty two.",
    "<think>Let me think about it.</think> Sure.",
]

# Qwen-style ChatML: enough for mlx-lm's apply_chat_template.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _tokenizer(out: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(SENTENCES, trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
        "eos_token": "<|im_end|>",
        "bos_token": None,
        "pad_token": "<|endoftext|>",
        "model_max_length": 2048,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return int(tok.get_vocab_size())


def _weights(out: Path, vocab: int) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    head_dim = HIDDEN // HEADS
    tensors = {"model.embed_tokens.weight": w(vocab, HIDDEN), "lm_head.weight": w(vocab, HIDDEN)}
    for n in range(LAYERS):
        p = f"model.layers.{n}."
        for proj in ("q", "k", "v", "o"):
            tensors[f"{p}self_attn.{proj}_proj.weight"] = w(HEADS * head_dim, HIDDEN)
        tensors[f"{p}mlp.gate_proj.weight"] = w(INTERMEDIATE, HIDDEN)
        tensors[f"{p}mlp.up_proj.weight"] = w(INTERMEDIATE, HIDDEN)
        tensors[f"{p}mlp.down_proj.weight"] = w(HIDDEN, INTERMEDIATE)
        tensors[f"{p}input_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        tensors[f"{p}post_attention_layernorm.weight"] = np.ones(HIDDEN, np.float32)
    tensors["model.norm.weight"] = np.ones(HIDDEN, np.float32)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "mlx"})


def write_model(out: Path) -> Path:
    """Write the model into ``out`` (created) and return it."""
    out.mkdir(parents=True, exist_ok=True)
    vocab = _tokenizer(out)
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "intermediate_size": INTERMEDIATE,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "eos_token_id": SPECIAL.index("<|im_end|>"),
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    _weights(out, vocab)
    return out


if __name__ == "__main__":
    write_model(Path(sys.argv[1]))
