"""Which dialect a request speaks, decided once from its path: for its error's shape (``server``) and
for the tag its reply's figures carry to the telemetry (``OpenAIRoutes.engine_call``, every dialect's
one path to an engine, reads it from ``asked_in``: the server's middleware sets it for the request's
task, so the codecs above the one path need not pass it down)."""

from __future__ import annotations

from contextvars import ContextVar

from app.supervisor.api.anthropic import is_anthropic_path
from app.supervisor.api.ollama import is_ollama_path
from app.supervisor.router import Dialect

LEMONADE_PREFIXES = ("/api/v0/", "/api/v1/")

asked_in: ContextVar[Dialect] = ContextVar("asked_in", default=Dialect.OPENAI)


def dialect_of(path: str) -> Dialect:
    if is_anthropic_path(path):
        return Dialect.ANTHROPIC
    if is_ollama_path(path):
        return Dialect.OLLAMA
    return Dialect.LEMONADE if path.startswith(LEMONADE_PREFIXES) else Dialect.OPENAI
