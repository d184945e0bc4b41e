"""The local API: OpenAI-compatible under ``/v1/`` and Lemonade-compatible under ``/api/v1/`` (these
and Lemonade's ``/v0/`` and ``/api/v0/`` serve every route, Anthropic's ``messages`` included; ``/live``
is unprefixed; Ollama's ``/api/NAME`` too, and on Ollama's port as well when asked), a front end over
the router like the window and the CLI.

    server = ApiServer(router, "127.0.0.1", 13305, api_key=None)
    await server.start()     # on the running loop: `lemon-desk serve`'s, or the window's
    ...
    await server.stop()

Modules: ``server`` (listening, key, size limit, error shape), ``openai`` (models and generation,
passed through to the engines; ``engine_call`` is every dialect's one path to an engine),
``chat_events`` (an engine's chat stream read into events, for the other dialects), ``anthropic``
(Anthropic's Messages API over those events), ``ollama`` (Ollama's ``/api/NAME`` routes and ``/``;
``ollama_chat`` its chat bodies and replies, ``ollama_models`` its pull, copy and create), ``codec``
(what those two share: a reply streamed or gathered, the OpenAI pieces their requests become),
``lemonade`` (management), ``pulling`` (a pull followed as it goes, for Lemonade's and Ollama's),
``options`` (recipe options in Lemonade's names), ``system`` (``system-info`` in Lemonade's shape),
``bodies`` (request checks), ``errors``.
"""

from app.supervisor.api.server import DEFAULT_HOST, DEFAULT_PORT, ApiServer, check_exposure

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "ApiServer", "check_exposure"]
