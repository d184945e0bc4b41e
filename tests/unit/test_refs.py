"""Model references pick the right files from a repo's file list (lists shaped like real Hub repos)."""

from __future__ import annotations

import pytest

from app.core.errors import ModelError
from app.core.refs import (
    MAX_SHARDS,
    HubRef,
    RepoFile,
    RepoListing,
    gguf_variants,
    missing_shards,
    parse_ref,
    select,
    shard_names,
    shard_set,
)


def listing(*paths: str, repo: str = "org/repo") -> RepoListing:
    return RepoListing(
        repo, "c0ffee", tuple(RepoFile(p, 100 + i, sha256=f"{i:064x}") for i, p in enumerate(paths))
    )


QWEN = listing(
    ".gitattributes",
    "README.md",
    "Qwen3-4B-IQ4_XS.gguf",
    "Qwen3-4B-Q4_0.gguf",
    "Qwen3-4B-Q4_K_M.gguf",
    "Qwen3-4B-UD-Q4_K_XL.gguf",
    "Qwen3-4B-Q8_0.gguf",
    "Qwen3-4B-BF16.gguf",
)
SHARDED = listing(
    "README.md",
    "Q4_K_M/Big-Q4_K_M-00001-of-00003.gguf",
    "Q4_K_M/Big-Q4_K_M-00002-of-00003.gguf",
    "Q4_K_M/Big-Q4_K_M-00003-of-00003.gguf",
    "Big-Q8_0-00001-of-00002.gguf",
    "Big-Q8_0-00002-of-00002.gguf",
    "Big-Q2_K.gguf",
)
VISION = listing(
    "gemma-3-4b-it-Q4_K_M.gguf", "mmproj-model-f32.gguf", "mmproj-model-f16.gguf", "mmproj-BF16.gguf"
)
MLX = listing(
    "README.md",
    "config.json",
    "model.safetensors.index.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "figures/bench.png",
    "pytorch_model.bin",
)


def paths(ref: str, where: RepoListing, recipe: str | None = None) -> list[str]:
    return [f.path for f in select(where, parse_ref(ref), recipe).files]


def test_parse_ref() -> None:
    assert parse_ref("unsloth/Qwen3-0.6B-GGUF:Q4_0") == HubRef("unsloth/Qwen3-0.6B-GGUF", "Q4_0")
    assert parse_ref(" mlx-community/Qwen3-0.6B-4bit ") == HubRef("mlx-community/Qwen3-0.6B-4bit", None)
    assert str(parse_ref("a/b:file.gguf")) == "a/b:file.gguf"
    for bad in ("no-slash", "a/b/c", "/abs/path", "a/b:x:y", "../x", ""):
        with pytest.raises(ModelError, match="not a Hugging Face model reference"):
            parse_ref(bad)


def test_quant_variant_picks_the_single_file() -> None:
    assert paths("org/repo:Q4_K_M", QWEN) == ["Qwen3-4B-Q4_K_M.gguf"]
    assert paths("org/repo:q8_0", QWEN) == ["Qwen3-4B-Q8_0.gguf"]  # case does not matter
    assert paths("org/repo:UD-Q4_K_XL", QWEN) == ["Qwen3-4B-UD-Q4_K_XL.gguf"]
    assert paths("org/repo:Q4_0", QWEN) == ["Qwen3-4B-Q4_0.gguf"]


def test_exact_file_and_bare_repo() -> None:
    assert paths("org/repo:Qwen3-4B-BF16.gguf", QWEN) == ["Qwen3-4B-BF16.gguf"]
    # A bare repo: the first GGUF in path order (not the README, not a projector).
    assert paths("org/repo", QWEN) == ["Qwen3-4B-BF16.gguf"]


def test_sharded_variants_come_whole() -> None:
    folder = select(SHARDED, parse_ref("org/repo:Q4_K_M"))
    assert [f.path for f in folder.files] == [f"Q4_K_M/Big-Q4_K_M-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert folder.main == "Q4_K_M/Big-Q4_K_M-00001-of-00003.gguf"
    assert folder.size == sum(f.size for f in folder.files)
    flat = paths("org/repo:Q8_0", SHARDED)
    assert flat == ["Big-Q8_0-00001-of-00002.gguf", "Big-Q8_0-00002-of-00002.gguf"]
    # Naming one shard exactly still brings its siblings.
    assert paths("org/repo:Big-Q8_0-00002-of-00002.gguf", SHARDED) == flat
    assert set(gguf_variants(SHARDED)) == {"Q4_K_M", "Q8_0", "Q2_K"}


def test_ambiguous_and_missing_variants_list_the_choices() -> None:
    twins = listing("a-Q4_K_M.gguf", "b-Q4_K_M.gguf")
    with pytest.raises(ModelError, match="ambiguous") as err:
        select(twins, parse_ref("org/repo:Q4_K_M"))
    assert "org/repo:a-Q4_K_M.gguf" in str(err.value) and "org/repo:b-Q4_K_M.gguf" in str(err.value)
    with pytest.raises(ModelError, match="no variant 'Q3_K_S'") as err:
        select(QWEN, parse_ref("org/repo:Q3_K_S"))
    assert "Q4_K_M" in str(err.value) and "UD-Q4_K_XL" in str(err.value)
    with pytest.raises(ModelError, match=r"no file named nope\.gguf"):
        select(QWEN, parse_ref("org/repo:nope.gguf"))


def test_variant_does_not_match_inside_another_quant_name() -> None:
    repo = listing("m-IQ4_K_M.gguf", "m-Q4_K_M.gguf")
    assert paths("org/repo:Q4_K_M", repo) == ["m-Q4_K_M.gguf"]


def test_vision_models_bring_one_projector_preferring_f16() -> None:
    files = select(VISION, parse_ref("org/repo:Q4_K_M"))
    assert [f.path for f in files.files] == ["gemma-3-4b-it-Q4_K_M.gguf", "mmproj-model-f16.gguf"]
    assert files.main == "gemma-3-4b-it-Q4_K_M.gguf" and files.mmproj == "mmproj-model-f16.gguf"
    # The projector is never taken as the model itself.
    assert select(VISION, parse_ref("org/repo")).main == "gemma-3-4b-it-Q4_K_M.gguf"


def test_a_model_that_names_its_projector_gets_that_one() -> None:
    files = select(VISION, parse_ref("org/repo:Q4_K_M"), mmproj="mmproj-BF16.gguf")
    assert files.mmproj == "mmproj-BF16.gguf"
    assert [f.path for f in files.files] == ["gemma-3-4b-it-Q4_K_M.gguf", "mmproj-BF16.gguf"]
    with pytest.raises(ModelError, match=r"no GGUF file named mmproj-x\.gguf") as err:
        select(VISION, parse_ref("org/repo:Q4_K_M"), mmproj="mmproj-x.gguf")
    assert "mmproj-model-f16.gguf" in err.value.hint


def test_mlx_repo_is_taken_whole_but_only_what_the_engine_reads() -> None:
    files = select(MLX, parse_ref("org/repo"))
    assert files.recipe == "lemon-mlx"
    assert [f.path for f in files.files] == [
        "chat_template.jinja",
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    with pytest.raises(ModelError, match="MLX models take no variant"):
        select(MLX, HubRef("org/repo", "4bit"), "lemon-mlx")


def test_wrong_format_is_explained() -> None:
    with pytest.raises(ModelError, match="not an MLX model"):
        select(QWEN, parse_ref("org/repo"), "lemon-mlx")
    with pytest.raises(ModelError, match="no GGUF model files"):
        select(MLX, parse_ref("org/repo:Q4_K_M"))


def test_shard_bookkeeping() -> None:
    names = ["x-00001-of-00003.gguf", "x-00003-of-00003.gguf", "y.gguf"]
    assert missing_shards(names) == ["x-00002-of-00003.gguf"]
    assert missing_shards(["y.gguf"]) == []
    assert shard_set("x-00003-of-00003.gguf", names) == ["x-00001-of-00003.gguf", "x-00003-of-00003.gguf"]
    assert shard_set("y.gguf", names) == ["y.gguf"]


def test_names_announcing_more_shards_than_any_model_has_cost_no_count() -> None:
    """A listing (a hostile Hub's) of thousands of names that each announce 99,999 shards: counting
    every set's members was billions of steps, minutes of a stalled app. Such a name is a plain file's
    (no model comes in more than MAX_SHARDS shards), and what is counted stops at MAX_SHARDS names."""
    implausible = [f"d{i}/x-00001-of-99999.gguf" for i in range(5000)]
    assert missing_shards(implausible) == []
    assert shard_set(implausible[0], implausible) == [implausible[0]]
    assert shard_names(implausible[0]) == [implausible[0]]

    plausible = [f"d{i}/x-00001-of-{MAX_SHARDS:05d}.gguf" for i in range(5000)]
    missing = missing_shards(plausible)
    assert len(missing) == MAX_SHARDS and missing[:2] == [
        "d0/x-00002-of-01000.gguf",
        "d0/x-00003-of-01000.gguf",
    ]
    assert shard_names("X-00002-of-00002.GGUF") == ["X-00001-of-00002.GGUF", "X-00002-of-00002.GGUF"]
