"""Hugging Face model references and the files they pick from a repo.

``org/repo:VARIANT`` for GGUF: a quant group (one file ending ``VARIANT.gguf``, a set of shards
``...VARIANT-00001-of-00003.gguf``, or a ``VARIANT/`` folder of shards), ``org/repo:file.gguf`` an exact
file, a bare ``org/repo`` the first GGUF that is not a vision projector. Vision models bring their
``mmproj`` companion (the one a model names, else the repo's F16 one). An MLX repo is taken whole:
config, tokenizer, weights and their index.
"""

from __future__ import annotations

import fnmatch
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import NamedTuple

from app.core.errors import ModelError

GGUF_RECIPE = "llamacpp"
MLX_RECIPE = "lemon-mlx"

_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*", re.ASCII)  # the Hub's ids are ASCII
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
# The most shards a set may announce. gguf-split's names allow 99,999, but the largest real models come
# in tens of shards: a name announcing more (a hostile listing's) is a plain file's, not a set to count.
MAX_SHARDS = 1000
# The quant at the end of a file stem: Q4_K_M, IQ2_XXS, UD-Q4_K_XL, BF16, F16, MXFP4_MOE, ...
_QUANT = re.compile(r"(?:UD-)?(?:I?Q\d+(?:_[A-Z0-9]+)*|TQ\d_\d|MXFP4(?:_MOE)?|[BF]F?16|F32)$", re.IGNORECASE)
# What an MLX engine reads from a repo; READMEs, images and pickled weights stay on the Hub.
MLX_PATTERNS = ("*.json", "*.safetensors", "tokenizer.model", "*.tiktoken", "*.txt", "*.jinja")


@dataclass(frozen=True)
class HubRef:
    repo_id: str
    variant: str | None = None

    def __str__(self) -> str:
        return f"{self.repo_id}:{self.variant}" if self.variant else self.repo_id


def parse_ref(text: str) -> HubRef:
    """``org/repo`` or ``org/repo:VARIANT``; anything else is a ModelError saying the shape."""
    repo_id, _, variant = text.strip().partition(":")
    if not _REPO_ID.fullmatch(repo_id) or ".." in repo_id or (":" in variant):
        raise ModelError(
            f"'{text}' is not a Hugging Face model reference.",
            "Write it as org/repo or org/repo:VARIANT (for example unsloth/Qwen3-0.6B-GGUF:Q4_0).",
        )
    return HubRef(repo_id, variant or None)


@dataclass(frozen=True)
class RepoFile:
    path: str  # inside the repo, "/"-separated
    size: int
    sha256: str | None = None  # LFS files: the content's SHA-256
    blob_id: str | None = None  # the git blob id (SHA-1 of "blob <size>\0" + content)

    @property
    def oid(self) -> str:
        """The blob's name in the Hugging Face cache: the SHA-256 for LFS files, else the git blob id."""
        oid = self.sha256 or self.blob_id
        if not oid:
            raise ModelError(f"The Hub gave no checksum for {self.path}.", "Try again later.")
        return oid

    @property
    def name(self) -> str:
        return PurePosixPath(self.path).name


@dataclass(frozen=True)
class RepoListing:
    repo_id: str
    revision: str  # the commit the file list belongs to
    files: tuple[RepoFile, ...]
    gated: bool = False  # the Hub wants an accepted licence and a token before it serves the files


@dataclass(frozen=True)
class FileSet:
    """The files a reference needs: what to download, what to load."""

    repo_id: str
    revision: str
    recipe: str
    label: str  # the variant's name, for people
    files: tuple[RepoFile, ...]
    main: str | None = None  # GGUF: the file to give the engine (the first shard)
    mmproj: str | None = None  # GGUF vision: the projector file

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


def is_gguf(path: str) -> bool:
    return path.lower().endswith(".gguf")


def is_mmproj(path: str) -> bool:
    return is_gguf(path) and "mmproj" in PurePosixPath(path).name.lower()


class _Shard(NamedTuple):
    """What a shard's name ``<prefix>-00002-of-00003.gguf`` says of its set."""

    prefix: str
    total: int
    suffix: str  # ".gguf", as the name writes it

    def names(self) -> Iterator[str]:
        """Every name of the set, first to last."""
        return (f"{self.prefix}-{n:05d}-of-{self.total:05d}{self.suffix}" for n in range(1, self.total + 1))


def _shard(path: str) -> _Shard | None:
    """The set a shard's name announces; None for a name that is no shard's (or announces more than
    ``MAX_SHARDS``)."""
    match = _SHARD.search(path)
    if match is None or int(match.group(2)) > MAX_SHARDS:
        return None
    return _Shard(path[: match.start()], int(match.group(2)), path[match.end() - len(".gguf") :])


def _group_key(path: str) -> str:
    """Shards of one quant share a key: their folder, or their name without the shard suffix."""
    shard = _shard(path)
    if shard is None:
        return path[: -len(".gguf")]
    parent = str(PurePosixPath(path).parent)
    return parent if parent != "." else shard.prefix


def _ends_with_variant(key: str, variant: str) -> bool:
    """``model-Q4_K_M`` and the folder ``Q4_K_M`` end with ``q4_k_m``; ``model-IQ4_K_M`` does not."""
    key, variant = key.lower(), variant.lower()
    return key.endswith(variant) and (len(key) == len(variant) or key[-len(variant) - 1] in "-._/")


def quant_groups(listing: RepoListing) -> dict[str, tuple[RepoFile, ...]]:
    """Model GGUFs grouped by quant, keyed by the group's folder or file stem, in path order."""
    groups: dict[str, list[RepoFile]] = {}
    for f in sorted(listing.files, key=lambda f: f.path):
        if is_gguf(f.path) and not is_mmproj(f.path):
            groups.setdefault(_group_key(f.path), []).append(f)
    return {key: tuple(files) for key, files in groups.items()}


def variant_label(key: str) -> str:
    """``Qwen3-0.6B-Q4_K_M`` -> ``Q4_K_M``; a folder name or an unrecognised stem stays as it is."""
    stem = PurePosixPath(key).name
    match = _QUANT.search(stem)
    return match.group(0) if match and match.start() > 0 and stem[match.start() - 1] in "-._" else stem


def gguf_variants(listing: RepoListing) -> dict[str, tuple[RepoFile, ...]]:
    """Quant groups keyed by a short label (``Q4_K_M``), the group key where labels would collide."""
    groups = quant_groups(listing)
    labels = [variant_label(k) for k in groups]
    return {
        (label if labels.count(label) == 1 else key): files
        for (key, files), label in zip(groups.items(), labels, strict=True)
    }


def _choices(keys: list[str]) -> str:
    return ", ".join(keys) if keys else "none"


def _pick_mmproj(listing: RepoListing) -> RepoFile | None:
    projectors = sorted((f for f in listing.files if is_mmproj(f.path)), key=lambda f: f.path)
    # llama.cpp's own conversions are F16; prefer that over F32 / BF16 copies of the same projector.
    preferred = [f for f in projectors if "f16" in f.name.lower() and "bf16" not in f.name.lower()]
    return next(iter(preferred or projectors), None)


def _named_mmproj(listing: RepoListing, name: str) -> RepoFile:
    wanted = name.lower()
    found = [f for f in listing.files if is_gguf(f.path) and wanted in (f.path.lower(), f.name.lower())]
    if len(found) != 1:
        projectors = [f.path for f in listing.files if is_mmproj(f.path)]
        what = "several files" if found else "no GGUF file"
        raise ModelError(
            f"{listing.repo_id} has {what} named {name} to use as the vision projector.",
            f"Projectors there: {_choices(projectors)}.",
        )
    return found[0]


def _gguf_set(
    listing: RepoListing, key: str, files: tuple[RepoFile, ...], mmproj_name: str | None = None
) -> FileSet:
    mmproj = _named_mmproj(listing, mmproj_name) if mmproj_name else _pick_mmproj(listing)
    return FileSet(
        repo_id=listing.repo_id,
        revision=listing.revision,
        recipe=GGUF_RECIPE,
        label=variant_label(key),
        files=files + ((mmproj,) if mmproj else ()),
        main=files[0].path,
        mmproj=mmproj.path if mmproj else None,
    )


def select_gguf(listing: RepoListing, variant: str | None, mmproj: str | None = None) -> FileSet:
    """The quant group ``variant`` names and its projector (``mmproj``: a file the model names)."""
    groups = quant_groups(listing)
    where = listing.repo_id
    if not groups:
        raise ModelError(f"{where} has no GGUF model files.", "Pick a GGUF repo, or use an MLX model.")
    if variant is None:
        key = next(iter(groups))
        return _gguf_set(listing, key, groups[key], mmproj)
    wanted = variant.lower()
    if wanted.endswith(".gguf"):
        exact = [
            k for k, files in groups.items() for f in files if wanted in (f.path.lower(), f.name.lower())
        ]
        if len(exact) == 1:
            return _gguf_set(listing, exact[0], groups[exact[0]], mmproj)
        if len(exact) > 1:
            raise ModelError(
                f"'{variant}' names several files in {where}.", "Give its full path inside the repo."
            )
        raise ModelError(
            f"{where} has no file named {variant}.",
            f"Files there: {_choices([f.path for files in groups.values() for f in files])}.",
        )
    matches = [key for key in groups if _ends_with_variant(key, variant)]
    exact = [key for key in matches if variant_label(key).lower() == wanted]
    if len(matches) > 1 and len(exact) == 1:
        matches = exact  # ":Q4_K_M" means the plain one when a "UD-Q4_K_M" sits beside it
    if len(matches) == 1:
        return _gguf_set(listing, matches[0], groups[matches[0]], mmproj)
    labels = list(gguf_variants(listing))
    if matches:
        raise ModelError(
            f"'{variant}' is ambiguous in {where}: it matches {_choices(matches)}.",
            f"Name one exactly: {_choices([f'{where}:{groups[m][0].name}' for m in matches])}.",
        )
    raise ModelError(f"{where} has no variant '{variant}'.", f"Variants there: {_choices(labels)}.")


def select_mlx(listing: RepoListing) -> FileSet:
    files = tuple(
        f
        for f in sorted(listing.files, key=lambda f: f.path)
        if "/" not in f.path and any(fnmatch.fnmatch(f.path.lower(), p) for p in MLX_PATTERNS)
    )
    names = {f.path for f in files}
    if "config.json" not in names or not any(n.endswith(".safetensors") for n in names):
        raise ModelError(
            f"{listing.repo_id} is not an MLX model: it needs config.json and .safetensors weights.",
            "Pick an MLX repo (for example from mlx-community), or a GGUF repo with :VARIANT.",
        )
    return FileSet(listing.repo_id, listing.revision, MLX_RECIPE, "MLX", files)


def guess_recipe(listing: RepoListing) -> str:
    """GGUF repos run on llama.cpp; repos with safetensors and a config on lemon-mlx."""
    return GGUF_RECIPE if quant_groups(listing) else MLX_RECIPE


def select(
    listing: RepoListing, ref: HubRef, recipe: str | None = None, mmproj: str | None = None
) -> FileSet:
    """The files ``ref`` needs; ``recipe`` None means: GGUF if the repo has any, else MLX. ``mmproj``
    names a GGUF model's projector."""
    recipe = recipe or (GGUF_RECIPE if ref.variant else guess_recipe(listing))
    if recipe == GGUF_RECIPE:
        return select_gguf(listing, ref.variant, mmproj)
    if ref.variant:
        raise ModelError(f"MLX models take no variant ('{ref}').", f"Use {ref.repo_id} alone.")
    return select_mlx(listing)


def shard_names(name: str) -> list[str]:
    """Every name of the shard set ``name`` belongs to, first to last (just ``[name]`` if it is no shard)."""
    shard = _shard(name)
    return list(shard.names()) if shard else [name]


def shard_set(name: str, names: list[str]) -> list[str]:
    """The names in ``names`` from the same shard set as ``name`` (just ``[name]`` if it is no shard)."""
    shard = _shard(name)
    if shard is None:
        return [name]
    return sorted(n for n in names if _shard(n) == shard)


def missing_shards(files: tuple[RepoFile, ...] | list[str]) -> list[str]:
    """Shards a set of GGUF files announces (``-NNNNN-of-MMMMM``) but does not hold: at most
    ``MAX_SHARDS`` of them, enough to tell a set is incomplete and to name what it lacks. Each set is
    counted once, and the count stops there: the work grows with the files, not with what they announce."""
    paths = {f if isinstance(f, str) else f.path for f in files}
    sets = sorted({shard for path in paths if (shard := _shard(path))})
    missing = (name for shard in sets for name in shard.names() if name not in paths)
    return sorted(itertools.islice(missing, MAX_SHARDS))
