"""Secrets live only in the OS keychain (keyring): never in settings, logs or a command line.

The Hugging Face token, each remote server's API key (account ``remote:NAME``), and each MCP server's
bearer token (account ``mcp:NAME``).

keyring is imported when a secret is first read or written: finding its backends costs start-up time
that the window's first paint does not need.

keyring's Linux backend lets its Secret Service library's own errors through (secretstorage's, and the
D-Bus library's under them, and an OSError when the bus cannot be reached): an item deleted by another
process between the search and the read, or the delete, raises ``ItemNotFoundException``, not a
``KeyringError``. Every call here catches them all: a secret gone meanwhile is no secret (read) or
already deleted (delete); any other error is logged (read) or said as a ``ConfigError`` (write, delete).
"""

from __future__ import annotations

import logging
import os
from contextlib import suppress

from app.core.errors import ConfigError

log = logging.getLogger(__name__)

SERVICE = "lemon-desk"
HF_TOKEN_KEY = "huggingface-token"
REMOTE_KEY_PREFIX = "remote:"
MCP_TOKEN_PREFIX = "mcp:"
NO_KEYCHAIN_HINT = "No usable OS keychain was found; set HF_TOKEN in the environment instead."
NO_KEYCHAIN_FOR_REMOTE = (
    "No usable OS keychain was found (on Linux: a Secret Service such as gnome-keyring or KWallet); "
    "the key is kept nowhere else."
)


def _keychain_errors() -> tuple[type[Exception], ...]:
    """The errors a keychain call can raise: keyring's, on Linux its Secret Service library's, and the
    OSError of a D-Bus connection that cannot be made (the session bus gone, or its socket)."""
    from keyring.errors import KeyringError

    errors: list[type[Exception]] = [KeyringError, OSError]
    with suppress(ImportError):  # Linux only, as the packages are
        from jeepney.wrappers import DBusErrorResponse
        from secretstorage.exceptions import SecretStorageException

        errors += [SecretStorageException, DBusErrorResponse]
    return tuple(errors)


def _gone(err: Exception) -> bool:
    """Whether ``err`` says there is no such secret (never stored, or deleted meanwhile)."""
    from keyring.errors import PasswordDeleteError

    if isinstance(err, PasswordDeleteError):
        return True
    try:
        from secretstorage.exceptions import ItemNotFoundException, PromptDismissedException
    except ImportError:
        return False
    return isinstance(err, ItemNotFoundException) and not isinstance(err, PromptDismissedException)


def _none_here(err: Exception) -> bool:
    """Whether ``err`` says this machine has no keychain at all (nothing to warn about at each read)."""
    from keyring.errors import NoKeyringError

    return isinstance(err, NoKeyringError)


def _describe(err: Exception) -> str:
    return str(err) or type(err).__name__


def _get(account: str) -> str | None:
    import keyring

    try:
        return keyring.get_password(SERVICE, account) or None
    except _keychain_errors() as err:
        if _none_here(err):
            log.debug("no keychain to read %s from: %s", account, _describe(err))
        elif not _gone(err):
            log.warning("could not read %s from the keychain: %s", account, _describe(err))
        return None


def _set(account: str, secret: str, what: str, hint: str) -> None:
    import keyring

    try:
        keyring.set_password(SERVICE, account, secret)
    except _keychain_errors() as err:
        raise ConfigError(f"Could not store the {what} in the keychain ({_describe(err)}).", hint) from None


def _delete(account: str, what: str, hint: str) -> None:
    import keyring

    try:
        keyring.delete_password(SERVICE, account)
    except _keychain_errors() as err:
        if _gone(err):
            return  # nothing stored (or deleted meanwhile): already as asked
        message = f"Could not remove the {what} from the keychain ({_describe(err)})."
        raise ConfigError(message, hint) from None


def get_hf_token() -> str | None:
    """The Hugging Face token: HF_TOKEN if set, else the keychain's; None when there is none."""
    env = os.environ.get("HF_TOKEN")
    if env:
        return env
    return _get(HF_TOKEN_KEY)


def set_hf_token(token: str) -> None:
    _set(HF_TOKEN_KEY, token, "token", NO_KEYCHAIN_HINT)


def delete_hf_token() -> None:
    _delete(HF_TOKEN_KEY, "token", NO_KEYCHAIN_HINT)


def get_remote_key(name: str) -> str | None:
    """The API key of the remote ``name``, or None (none stored, or no keychain to ask)."""
    return _get(REMOTE_KEY_PREFIX + name)


def set_remote_key(name: str, key: str) -> None:
    _set(REMOTE_KEY_PREFIX + name, key, f"key of the remote {name}", NO_KEYCHAIN_FOR_REMOTE)


def delete_remote_key(name: str) -> None:
    _delete(REMOTE_KEY_PREFIX + name, f"key of the remote {name}", NO_KEYCHAIN_FOR_REMOTE)


def get_mcp_token(name: str) -> str | None:
    """The bearer token of the MCP server ``name``, or None (none stored, or no keychain to ask)."""
    return _get(MCP_TOKEN_PREFIX + name)


def set_mcp_token(name: str, token: str) -> None:
    _set(MCP_TOKEN_PREFIX + name, token, f"token of the MCP server {name}", NO_KEYCHAIN_FOR_REMOTE)


def delete_mcp_token(name: str) -> None:
    _delete(MCP_TOKEN_PREFIX + name, f"token of the MCP server {name}", NO_KEYCHAIN_FOR_REMOTE)
