"""Every error a user can see, in one tree.

LemonDeskError                  what happened + what to do (``hint``)
├── ConfigError                 a file or value the app reads is malformed
│   └── HardwareProfileError    LEMON_DESK_MOCK_HARDWARE points at a bad profile
├── UnsupportedError            a backend cannot run on this machine
├── DownloadError               an HTTP download failed
│   └── ChecksumError           what arrived is not what was expected (deleted)
├── InstallError                download / verify / unpack of an engine failed
├── StorageError                a file the app keeps could not be written (disk full, read-only)
├── AttachmentError             a file the user attached cannot be sent (gone, binary, not for this model)
├── ModelError                  a model reference, file or download is unusable
│   └── HubUnreachableError     the Hugging Face Hub did not answer (or not readably, or failed: 5xx)
│       └── HubBusyError        the Hub asks the app to wait before asking again (429)
├── UnsafePathError             a name from outside would put a file outside its folder (refused)
├── EngineError                 an engine failed to start, crashed or hung
│   └── WorkerError             an RPC worker is unreachable, busy or speaks another protocol
├── PolicyError                 the loading policy forbids a load (everything in the way is pinned)
├── FitError                    a model would not fit in the memory free now
└── RequestError                a request to an engine failed
    ├── UnsupportedRequestError the engine cannot answer this kind of request
    ├── ContextError            the prompt does not fit the model's context (the engine refused it)
    └── RemoteError             a remote server does not answer, or refused the key
"""

from __future__ import annotations


class LemonDeskError(Exception):
    """Base of every error shown to a user: ``str(err)`` says what happened, ``hint`` what to do."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} {self.hint}".strip() if self.hint else self.message


class ConfigError(LemonDeskError):
    """A file or setting the app reads is malformed."""


class HardwareProfileError(ConfigError):
    """The mock hardware profile is malformed."""


class UnsupportedError(LemonDeskError):
    """The requested backend cannot run on this machine."""


class DownloadError(LemonDeskError):
    """An HTTP download failed; ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, hint: str = "", status: int | None = None) -> None:
        super().__init__(message, hint)
        self.status = status


class ChecksumError(DownloadError):
    """A downloaded file's checksum does not match; the file was deleted."""


class InstallError(LemonDeskError):
    """Installing an engine failed."""


class StorageError(LemonDeskError):
    """A file the app keeps (the chat history, options, collections, remotes, user models, bench results)
    could not be written: the disk is full or read-only (``app.store.saving``)."""


class AttachmentError(LemonDeskError):
    """A file the user attached cannot be taken or sent: gone, unreadable, binary, or not for this model."""


class ModelError(LemonDeskError):
    """A model reference, file or download is unusable."""


class HubUnreachableError(ModelError):
    """The Hugging Face Hub could not be reached, sent an answer that does not read, or failed on its side
    (HTTP 5xx): nothing is known of the model asked for."""


class HubBusyError(HubUnreachableError):
    """The Hugging Face Hub refused to answer for now (HTTP 429, too many requests); the hint says when
    to try again, when the Hub said."""


class UnsafePathError(LemonDeskError):
    """A path the app was about to write leads outside the folder it belongs in; nothing was written."""


class EngineError(LemonDeskError):
    """An engine failed to start, crashed or hung."""

    def __init__(self, message: str, hint: str = "", last_output: str = "") -> None:
        super().__init__(message, hint)
        self.last_output = last_output

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base}\n--- engine output ---\n{self.last_output}" if self.last_output else base


class WorkerError(EngineError):
    """RPC workers a load needs cannot serve it; ``workers`` names them (``host:port``)."""

    def __init__(self, message: str, hint: str = "", workers: tuple[str, ...] = ()) -> None:
        super().__init__(message, hint)
        self.workers = workers


class PolicyError(LemonDeskError):
    """The loading policy forbids a load: the models that would have to make room are pinned."""

    def __init__(self, message: str, hint: str = "", pinned: tuple[str, ...] = ()) -> None:
        super().__init__(message, hint)
        self.pinned = pinned


class FitError(LemonDeskError):
    """A model would not fit in the memory free now; loading it anyway needs ``force``."""


class RequestError(LemonDeskError):
    """A request to an engine failed; ``status`` is the engine's HTTP status when it answered with one."""

    def __init__(self, message: str, hint: str = "", status: int | None = None) -> None:
        super().__init__(message, hint)
        self.status = status


class UnsupportedRequestError(RequestError):
    """The engine has no such route or cannot answer the request in that form (e.g. streamed)."""


class ContextError(RequestError):
    """The engine refused a prompt of ``needed`` tokens: its context holds ``context``."""

    def __init__(self, needed: int, context: int, status: int | None = 400) -> None:
        super().__init__(
            f"The chat is too long for the model: it needs {needed:,} tokens and the model's context "
            f"holds {context:,}. The engine refused it, and nothing was cut.",
            "Load the model with a larger context, go on in a new chat that starts with a summary, "
            "or leave out the oldest turns.",
            status=status,
        )
        self.needed = needed
        self.context = context


class RemoteError(RequestError):
    """A remote server (``@NAME/MODEL``) does not answer, or refused the key; ``remote`` names it."""

    def __init__(self, message: str, hint: str = "", remote: str = "", status: int | None = None) -> None:
        super().__init__(message, hint, status)
        self.remote = remote
