"""Secrets live only in the OS keychain (keyring): never in settings, logs or a command line.

keyring is imported when a secret is first read or written: finding its backends costs start-up time
that the window's first paint does not need.
"""

from __future__ import annotations

import os

from app.core.errors import ConfigError

SERVICE = "lemon-desk"
HF_TOKEN_KEY = "huggingface-token"
NO_KEYCHAIN_HINT = "No usable OS keychain was found; set HF_TOKEN in the environment instead."


def get_hf_token() -> str | None:
    """The Hugging Face token: HF_TOKEN if set, else the keychain's; None when there is none."""
    env = os.environ.get("HF_TOKEN")
    if env:
        return env
    import keyring
    from keyring.errors import KeyringError

    try:
        return keyring.get_password(SERVICE, HF_TOKEN_KEY) or None
    except KeyringError:
        return None


def set_hf_token(token: str) -> None:
    import keyring
    from keyring.errors import KeyringError

    try:
        keyring.set_password(SERVICE, HF_TOKEN_KEY, token)
    except KeyringError as err:
        raise ConfigError(f"Could not store the token in the keychain ({err}).", NO_KEYCHAIN_HINT) from None


def delete_hf_token() -> None:
    import keyring
    from keyring.errors import KeyringError, PasswordDeleteError

    try:
        keyring.delete_password(SERVICE, HF_TOKEN_KEY)
    except PasswordDeleteError:
        return  # nothing stored: already as asked
    except KeyringError as err:
        raise ConfigError(
            f"Could not remove the token from the keychain ({err}).", NO_KEYCHAIN_HINT
        ) from None
