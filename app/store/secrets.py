"""Secrets live only in the OS keychain (keyring): never in settings, logs or a command line.

The Hugging Face token, and each remote server's API key (account ``remote:NAME``).

keyring is imported when a secret is first read or written: finding its backends costs start-up time
that the window's first paint does not need.
"""

from __future__ import annotations

import os

from app.core.errors import ConfigError

SERVICE = "lemon-desk"
HF_TOKEN_KEY = "huggingface-token"
REMOTE_KEY_PREFIX = "remote:"
NO_KEYCHAIN_HINT = "No usable OS keychain was found; set HF_TOKEN in the environment instead."
NO_KEYCHAIN_FOR_REMOTE = (
    "No usable OS keychain was found (on Linux: a Secret Service such as gnome-keyring or KWallet); "
    "the key is kept nowhere else."
)


def _get(account: str) -> str | None:
    import keyring
    from keyring.errors import KeyringError

    try:
        return keyring.get_password(SERVICE, account) or None
    except KeyringError:
        return None


def _set(account: str, secret: str, what: str, hint: str) -> None:
    import keyring
    from keyring.errors import KeyringError

    try:
        keyring.set_password(SERVICE, account, secret)
    except KeyringError as err:
        raise ConfigError(f"Could not store the {what} in the keychain ({err}).", hint) from None


def _delete(account: str, what: str, hint: str) -> None:
    import keyring
    from keyring.errors import KeyringError, PasswordDeleteError

    try:
        keyring.delete_password(SERVICE, account)
    except PasswordDeleteError:
        return  # nothing stored: already as asked
    except KeyringError as err:
        raise ConfigError(f"Could not remove the {what} from the keychain ({err}).", hint) from None


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
