"""Names that come from the network, checked before anything turns them into a path.

A Hub listing (or a record of one kept on disk) names files, a commit and blob ids; a release names
its asset. Each becomes part of a path under the Hugging Face cache or the app's home, so a mirror, a
proxy or a mistyped ``HF_ENDPOINT`` could otherwise write anywhere the user can. The rules are the
Hub's own, and strict: a file is a relative POSIX path of plain segments; a revision is a commit id
(40 lowercase hex digits); a blob is named by its SHA-256 (64) or git blob id (40), lowercase as the
Hub and ``huggingface_hub`` write them.

A model's name (from a collection file, or a ``pull`` that registers a user model) keys the app's own
records and shows in every list, so it keeps to a small alphabet too: letters, digits, ``.``, ``_``
and ``-``, at most 128 characters after Lemonade's ``user.`` namespace.
"""

from __future__ import annotations

import re
import unicodedata

from app.core.errors import ModelError
from app.core.refs import HubRef, RepoListing, parse_ref

_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_BLOB_ID = _COMMIT
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MODEL_NAME_MAX = 128
_MODEL_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{_MODEL_NAME_MAX - 1}}}")
_NOT_IN_MODEL_NAME = re.compile(r"[^A-Za-z0-9._-]+")
USER_PREFIX = "user."  # Lemonade's namespace for the models a user registers
MODEL_NAME_RULE = "letters, digits, '.', '_', '-'; at most 128"
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def path_problem(path: object) -> str | None:
    """Why ``path`` is not a safe relative POSIX path inside a folder, or None when it is one."""
    if not isinstance(path, str) or not path:
        return "is empty or not text"
    if _CONTROL.search(path):
        return "holds a control character"
    if "\\" in path:
        return "holds a backslash"
    if path.startswith("/"):
        return "is an absolute path"
    segments = path.split("/")
    if "" in segments:
        return "has an empty segment"
    if ".." in segments or "." in segments:
        return "has a '..' or '.' segment"
    return None


def plain_name_problem(name: object, max_length: int) -> str | None:
    """Why ``name`` is not a plain name the user gives (a remote's): letters, digits, ``.``, ``_`` and
    ``-``, starting with a letter or digit, no ``..``, at most ``max_length`` characters; else None."""
    if not isinstance(name, str) or not name:
        return "is empty"
    if len(name) > max_length:
        return f"is longer than {max_length} characters"
    if not _PLAIN_NAME.fullmatch(name) or ".." in name:
        return "holds characters other than letters, digits, '.', '_' and '-' (or '..')"
    return None


def file_name_problem(name: object) -> str | None:
    """Why ``name`` is not one plain file name (a release asset), or None when it is one."""
    if isinstance(name, str) and "/" in name:
        return "is a path, not a file name"
    return path_problem(name)


def bare_model_name(name: str) -> str:
    """``name`` without Lemonade's ``user.`` namespace."""
    return name[len(USER_PREFIX) :] if name.startswith(USER_PREFIX) else name


def model_name_problem(name: object) -> str | None:
    """Why ``name`` (with or without ``user.``) is not a model name, or None when it is one."""
    if not isinstance(name, str):
        return "is not a string"
    bare = bare_model_name(name)
    if not _MODEL_NAME.fullmatch(bare) or ".." in bare:
        return f"{name!r} is not a model name ({MODEL_NAME_RULE})"
    return None


def in_user_namespace(name: str) -> str:
    """``name`` in Lemonade's ``user.`` namespace: the prefix is added when it is not there."""
    return name if name.startswith(USER_PREFIX) else USER_PREFIX + name


def model_name_from(text: str) -> str:
    """A model name made from ``text`` (a file or folder name): accents dropped, each run of other
    characters made one '-', no '..', starting and ending with a letter or digit, at most 128; "model"
    when nothing is left."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    name = re.sub(r"\.{2,}", ".", _NOT_IN_MODEL_NAME.sub("-", ascii_text))
    return name.lstrip("._-")[:_MODEL_NAME_MAX].rstrip("._-") or "model"


def _hex_problem(value: object, pattern: re.Pattern[str], what: str) -> str | None:
    ok = isinstance(value, str) and pattern.fullmatch(value)
    return None if ok else f"is not {what}"


def repo_id_problem(repo_id: object) -> str | None:
    try:
        ok = isinstance(repo_id, str) and parse_ref(repo_id) == HubRef(repo_id)
    except ModelError:
        ok = False
    return None if ok else "is not a repo id (org/repo)"


def check_repo_id(repo_id: str) -> str:
    """``repo_id`` once it is a Hub repo id (``owner/name``), fit to go into a URL; else a ModelError."""
    if repo_id_problem(repo_id):
        raise ModelError(
            f"{repo_id[:200]!r} is not a Hugging Face repository id.",
            "A repository id is owner/name, in letters, digits, '-', '_' and '.'.",
        )
    return repo_id


def listing_problem(listing: RepoListing) -> str | None:
    """What in a listing is not safe to become a path (the first thing found), or None."""
    if why := _hex_problem(listing.revision, _COMMIT, "a commit id (40 lowercase hex digits)"):
        return f"the revision {listing.revision!r} {why}"
    for f in listing.files:
        if why := path_problem(f.path):
            return f"the file name {f.path!r} {why}"
        if f.sha256 is not None and (why := _hex_problem(f.sha256, _SHA256, "a SHA-256 (64 hex digits)")):
            return f"the SHA-256 of {f.path!r}, {f.sha256!r}, {why}"
        if f.blob_id is not None and (why := _hex_problem(f.blob_id, _BLOB_ID, "a git blob id (40 hex)")):
            return f"the blob id of {f.path!r}, {f.blob_id!r}, {why}"
    return None


def check_listing(listing: RepoListing) -> RepoListing:
    """The listing, once every name in it is safe to use as a path; else a ModelError saying which."""
    if why := listing_problem(listing):
        raise ModelError(
            f"The Hub's file list for {listing.repo_id} is not safe to use: {why}. Nothing was downloaded.",
            "The Hub or a mirror/proxy sent a file name that is not safe; check HF_ENDPOINT "
            "(unset it to use huggingface.co), and report the repo if it comes from the Hub itself.",
        )
    return listing
