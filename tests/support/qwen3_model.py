"""A tiny MLX model shaped like Qwen3 (``model_type: qwen3``, 2 layers, ``q_norm``/``k_norm``) whose
weights are set, not trained, so that it always gives the same reply: ``REPLY``, then its end token.

lemon-mlx-engine b1050-stable serves qwen3-shaped models (a llama-shaped one makes it exit 1, see
docs/lemon-mlx-engine.md), and a known reply lets a test check what the app did with it (the
``<think>`` split, a stop string, a limit cut inside a two-byte character). Made with the ``mlx`` and
``tokenizers`` packages, nothing downloaded; run it with a Python that has both (the cached mlx-lm test
venv): ``python tests/support/qwen3_model.py OUT_DIR [--endless]``. It writes ``reply.json`` beside the
model: the reply's tokens as the engine counts them, for the tests. ``--endless`` makes a model whose
reply never ends (after its last token it goes on from its second), for benchmarks of long replies.

How the weights make the reply: every token's embedding is nearly orthogonal to the others, the
attention and MLP outputs are kept tiny, so the last hidden state is (almost) the last token's own
embedding; the output head then maps each reply token to the next one (a bigram table), and every
other token to the reply's first one, through one dimension that all embeddings but the reply's
share.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 16
INTERMEDIATE = 128
VOCAB = 300

# The reply: reasoning first, as Qwen3 gives it, then an answer holding "é", which byte-level BPE
# keeps as two tokens whose first decodes to no text (the engine's finish_reason quirk needs one).
REPLY = "<think>Let me think</think>Sure, é lemon!"
THINK_TOKENS = ["<think>", "</think>"]  # added tokens, not special: decoding keeps them, as Qwen3's
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Repeated so that BPE merges the reply's words into one token each (a reply token may not repeat).
SENTENCES = [
    "Hello there, how are you today?",
    *["Let me think", "Sure, lemon!"] * 3,
    "A lemon is a yellow citrus fruit.",
    "The quick brown fox jumps over the lazy dog.",
]

# Qwen-style ChatML.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _tokenizer(out: Path) -> tuple[int, list[int], int]:
    """Write tokenizer.json and tokenizer_config.json; return the vocabulary size, the reply's token
    ids and the end token's id."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

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
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    tok.save(str(out / "tokenizer.json"))
    reply = tok.encode(REPLY).ids
    if len(set(reply)) != len(reply):  # a bigram table can only follow a reply of distinct tokens
        raise SystemExit(f"the reply's tokens repeat: {tok.encode(REPLY).tokens}")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
        "eos_token": "<|im_end|>",
        "bos_token": None,
        "pad_token": "<|endoftext|>",
        "model_max_length": 2048,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out / "reply.json").write_text(
        json.dumps({"text": REPLY, "tokens": tok.encode(REPLY).tokens, "ids": reply}, indent=2)
    )
    return int(tok.get_vocab_size()), reply, int(tok.token_to_id("<|im_end|>"))


def _weights(out: Path, vocab: int, reply: list[int], eos: int, endless: bool) -> None:
    import mlx.core as mx

    mx.random.seed(0)

    def small(*shape: int) -> mx.array:
        return mx.random.normal(shape) * 0.002

    # Embeddings: random directions (near-orthogonal in 63 dimensions), plus dimension 0, +4 for every
    # token but the reply's (-4): the head reads it to start the reply after any prompt.
    embed = mx.random.normal((vocab, HIDDEN))
    routing = mx.full((vocab,), 4.0)
    routing[mx.array(reply)] = -4.0
    embed[:, 0] = routing
    # The head: each reply token's logit row is the previous reply token's embedding (without the
    # routing dimension), the first one's the routing dimension; the end token follows the last (or,
    # endless, the second token: the first is the routing dimension's alone).
    head = mx.zeros((vocab, HIDDEN))
    follows = [*reply[1:], reply[1] if endless else eos]
    for before, after in zip(reply, follows, strict=True):
        row = embed[before]
        row[0] = 0.0
        head[after] = head[after] + row
    head[reply[0], 0] = 16.0
    tensors = {
        "model.embed_tokens.weight": embed,
        "lm_head.weight": head,
        "model.norm.weight": mx.ones(HIDDEN),
    }
    for n in range(LAYERS):
        p = f"model.layers.{n}."
        tensors[f"{p}self_attn.q_proj.weight"] = small(HEADS * HEAD_DIM, HIDDEN)
        tensors[f"{p}self_attn.k_proj.weight"] = small(KV_HEADS * HEAD_DIM, HIDDEN)
        tensors[f"{p}self_attn.v_proj.weight"] = small(KV_HEADS * HEAD_DIM, HIDDEN)
        tensors[f"{p}self_attn.o_proj.weight"] = small(HIDDEN, HEADS * HEAD_DIM)
        tensors[f"{p}self_attn.q_norm.weight"] = mx.ones(HEAD_DIM)
        tensors[f"{p}self_attn.k_norm.weight"] = mx.ones(HEAD_DIM)
        tensors[f"{p}mlp.gate_proj.weight"] = small(INTERMEDIATE, HIDDEN)
        tensors[f"{p}mlp.up_proj.weight"] = small(INTERMEDIATE, HIDDEN)
        tensors[f"{p}mlp.down_proj.weight"] = small(HIDDEN, INTERMEDIATE)
        tensors[f"{p}input_layernorm.weight"] = mx.ones(HIDDEN)
        tensors[f"{p}post_attention_layernorm.weight"] = mx.ones(HIDDEN)
    mx.save_safetensors(str(out / "model.safetensors"), tensors, metadata={"format": "mlx"})


def write_model(out: Path, endless: bool = False) -> Path:
    """Write the model into ``out`` (created) and return it."""
    out.mkdir(parents=True, exist_ok=True)
    vocab, reply, eos = _tokenizer(out)
    config = {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "intermediate_size": INTERMEDIATE,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "eos_token_id": eos,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    _weights(out, vocab, reply, eos, endless)
    return out


if __name__ == "__main__":
    write_model(Path(sys.argv[1]), endless="--endless" in sys.argv[2:])
