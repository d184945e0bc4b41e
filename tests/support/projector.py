"""A vision projector GGUF for the SmolLM2 test model, made here: no real small projector can be had on a
machine that reaches no Hugging Face.

It is a real file of llama.cpp's multimodal format (``tools/mtmd/clip.cpp``): a LLaVA-style projector
(``clip.projector_type = "mlp"``), a tiny CLIP vision encoder (32x32 px images in 8x8 patches: 16 image
tokens; 64 wide, 2 layers) and a two-layer MLP onto SmolLM2's 576-wide embeddings, all F32, with random
weights. llama-server loads it with ``--mmproj`` and runs the whole image path (decode, resize,
normalise, encode, project, feed the embeddings to the model); what the model then says means nothing.
Named as what it is: a made projector, random weights.

The set-up (``python -m tests.support.prepare``, step ``projector``) makes it once under the tests' cache
folder (``make_projector``); tests find it with ``projector_gguf()``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from app.core.models import Model
from tests.support.llama import NotBuilt, cache_dir, made_once

VERSION = 1  # of the recipe below: a change makes a new file
TEXT_EMBD = 576  # SmolLM2-135M's embedding width
VISION_EMBD = 64
VISION_FF = 128
VISION_HEADS = 4
VISION_LAYERS = 2
IMAGE_SIZE = 32
PATCH_SIZE = 8
HIDDEN = 256  # the projector MLP's hidden width
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2


def projector_path() -> Path:
    return cache_dir() / f"smollm2-test-mmproj-v{VERSION}.gguf"


def write_projector(path: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    def zeros(n: int) -> np.ndarray:
        return np.zeros(n, dtype=np.float32)

    writer = GGUFWriter(str(path), "clip")
    writer.add_name("lemon-desk test projector (random weights)")
    writer.add_description("A made LLaVA-style projector for SmolLM2-135M: random weights, for tests only")
    writer.add_file_type(0)  # all F32
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.use_gelu", True)
    writer.add_string("clip.projector_type", "mlp")
    writer.add_uint32("clip.vision.embedding_length", VISION_EMBD)
    writer.add_uint32("clip.vision.feed_forward_length", VISION_FF)
    writer.add_uint32("clip.vision.block_count", VISION_LAYERS)
    writer.add_uint32("clip.vision.projection_dim", TEXT_EMBD)
    writer.add_uint32("clip.vision.attention.head_count", VISION_HEADS)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_uint32("clip.vision.image_size", IMAGE_SIZE)
    writer.add_uint32("clip.vision.patch_size", PATCH_SIZE)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])

    # numpy shapes are ggml's dimensions reversed: a (out, in) matrix is ggml [in, out].
    positions = IMAGE_TOKENS + 1  # the patches and the class embedding
    tensors = {
        "v.patch_embd.weight": weights(VISION_EMBD, 3, PATCH_SIZE, PATCH_SIZE),
        "v.class_embd": weights(VISION_EMBD),
        "v.position_embd.weight": weights(positions, VISION_EMBD),
        "v.pre_ln.weight": ones(VISION_EMBD),
        "v.pre_ln.bias": zeros(VISION_EMBD),
    }
    for i in range(VISION_LAYERS):
        block = f"v.blk.{i}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors[f"{block}.{name}.weight"] = weights(VISION_EMBD, VISION_EMBD)
            tensors[f"{block}.{name}.bias"] = zeros(VISION_EMBD)
        for norm in ("ln1", "ln2"):
            tensors[f"{block}.{norm}.weight"] = ones(VISION_EMBD)
            tensors[f"{block}.{norm}.bias"] = zeros(VISION_EMBD)
        tensors[f"{block}.ffn_up.weight"] = weights(VISION_FF, VISION_EMBD)
        tensors[f"{block}.ffn_up.bias"] = zeros(VISION_FF)
        tensors[f"{block}.ffn_down.weight"] = weights(VISION_EMBD, VISION_FF)
        tensors[f"{block}.ffn_down.bias"] = zeros(VISION_EMBD)
    tensors["mm.0.weight"] = weights(HIDDEN, VISION_EMBD)
    tensors["mm.0.bias"] = zeros(HIDDEN)
    tensors["mm.2.weight"] = weights(TEXT_EMBD, HIDDEN)
    tensors["mm.2.bias"] = zeros(TEXT_EMBD)
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def make_projector(say: Callable[[str], None]) -> Path:
    """The set-up's step: write the made projector once (a temporary file renamed into place, under a
    lock, as the other assets are made)."""
    path = projector_path()
    saying = f"writing a made projector (random weights) to {path}"
    return made_once(path, "projector", write_projector, say, saying)


def projector_gguf() -> Path:
    """The made projector, as the set-up (``python -m tests.support.prepare``) left it."""
    path = projector_path()
    if not path.is_file():
        raise NotBuilt(f"the made vision projector is not in {path.parent}")
    return path


VISION_REPO = "lemon-desk-tests/SmolLM2-made-vision-GGUF"
MAIN_FILE = "SmolLM2-135M-Instruct-Q4_1.gguf"
PROJECTOR_FILE = "mmproj-SmolLM2-made-F32.gguf"
COMMIT = "0" * 39 + "1"


def vision_model_in_cache(cache_root: Path, smollm: Path, name: str = "user.smol-vision") -> Model:
    """SmolLM2 and the made projector laid out as a Hub repo in the Hugging Face cache (``refs/main``,
    a snapshot of symlinks to the cached files), and the model that names them, to register."""
    folder = cache_root / ("models--" + VISION_REPO.replace("/", "--"))
    snapshot = folder / "snapshots" / COMMIT
    snapshot.mkdir(parents=True, exist_ok=True)
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text(COMMIT)
    for file, target in ((MAIN_FILE, smollm), (PROJECTOR_FILE, projector_gguf())):
        link = snapshot / file
        link.unlink(missing_ok=True)
        link.symlink_to(target)
    return Model(
        name,
        "llamacpp",
        f"{VISION_REPO}:Q4_1",
        labels=("vision",),
        size_gb=0.1,
        user=True,
        mmproj=PROJECTOR_FILE,
    )
