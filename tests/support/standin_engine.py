"""A stand-in for llama-server: a small stdlib HTTP server, run as a real child process, that answers like
llama-server (``/health``, ``/v1/models``, streamed and whole chat and text completions with ``timings``
and ``usage``; a prompt's words count as its tokens, and those it shares at the start with the previous
prompt as ``cache_n``, llama-server's prefix cache) and on command crashes, hangs, ignores SIGTERM or
slows down. It is a fake engine, named as one: it runs no model. It makes the watchdog, restarts and
loading policy testable in seconds.

It takes llama-server's command line (``-m MODEL --port P --host H --api-key-file F --ctx-size N
--alias NAME``, the alias being the ``model`` its replies name, else the file's name; other flags are
ignored) and ``--version``. The model file must start with the GGUF magic, as
llama-server checks. How it behaves comes from an optional sidecar ``<model path>.standin.json``:

    load_delay_s   seconds /health answers 503 "Loading model" before 200 (default 0.1)
    crash_on_load  true: print an error line after the load delay and exit with code 3
    tokens         pieces in a reply (default 8)
    token_delay_s  seconds between pieces of a reply (default 0.005)
    prompt_delay_s seconds a streamed reply's headers come before its first event, as llama-server's do
                   while it reads the prompt (default 0)
    reply          the reply's text, sent a word at a time (overrides ``tokens``)
    http10         true: answer HTTP/1.0 and close every connection after its answer, as mlx-lm's
                   server (Python's http.server) does
    tool_call      {"name": ..., "arguments": "JSON text"}: after its text, the reply calls that tool,
                   streamed as llama-server streams one (an id and the name, then the arguments in
                   pieces of 5 characters; finish_reason "tool_calls")
    tool_rounds    with tool_call: the reply calls the tool only while the conversation holds fewer
                   than this many ``tool`` messages; a reply to a conversation that ends in one says
                   ``tool said: `` and that message's first 200 characters (default: null, calls always)
    calls_at_once  with tool_call: how many calls of it a streamed reply makes (ids call_standin,
                   call_standin1, ...; default 1)
    template_caps  what ``/props`` says of the chat template (``chat_template_caps``, as llama-server says
                   it): default ``supports_tools`` and ``supports_tool_calls`` true with ``tool_call``;
                   without either, ``/props`` is not served
    reasoning      text a reasoning model thinks before its reply, sent a word at a time as
                   ``reasoning_content``, or inside ``content`` as ``<think>...</think>`` when the request
                   says ``reasoning_format: "none"`` (llama-server's two ways)

Like llama-server, it keeps a connection open after a whole reply and closes it after a streamed one.
Each request it answers is also logged as ``standin: METHOD PATH is request K on connection C``, so a
test can tell which requests shared a connection.

Control routes (loopback, no key), each answering 200 before it acts:

    POST /__standin__/crash            print "fatal: simulated crash" and exit 1 at once, even mid-reply
    POST /__standin__/hang             stop answering everything, /health included
    POST /__standin__/ignore_sigterm   ignore SIGTERM from now on (SIGKILL still works)
    POST /__standin__/slow             {"token_delay_s": x}: the delay between pieces from now on

stdlib only: it runs under whatever interpreter the wrapper's ``#!`` names (see ``standin.py``).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

VERSION_LINE = "version: 4242 (standin)"
SIDECAR_SUFFIX = ".standin.json"
DEFAULTS: dict[str, Any] = {
    "load_delay_s": 0.1,
    "crash_on_load": False,
    "tokens": 8,
    "token_delay_s": 0.005,
    "prompt_delay_s": 0.0,
    "reply": None,
    "http10": False,
    "tool_call": None,
    "tool_rounds": None,
    "template_caps": None,
    "calls_at_once": 1,
    "reasoning": None,
}
CONTROL = "/__standin__/"
PUBLIC = {"/health", "/v1/health", "/models", "/v1/models"}  # llama-server answers these without a key

_print_lock = threading.Lock()


def say(line: str) -> None:
    """One log line on stdout, flushed: the app reads the pipe line by line."""
    with _print_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def parse_args(argv: list[str]) -> dict[str, str]:
    """The flags the stand-in uses; every other flag (and its value) is ignored."""
    names = {
        "-m": "model",
        "--model": "model",
        "--port": "port",
        "--host": "host",
        "--api-key-file": "api_key_file",
        "-c": "ctx_size",
        "--ctx-size": "ctx_size",
        "-a": "alias",
        "--alias": "alias",
    }
    found: dict[str, str] = {}
    i = 0
    while i < len(argv):
        flag, eq, value = argv[i].partition("=")
        if flag in names:
            if not eq:
                i += 1
                value = argv[i] if i < len(argv) else ""
            found[names[flag]] = value
        i += 1
    return found


class Standin:
    """What every request handler shares: the behaviour, the key, and the switches the controls flip."""

    def __init__(
        self, model: str, behaviour: dict[str, Any], keys: set[str], ctx_size: int, alias: str = ""
    ) -> None:
        self.model = model
        self.model_id = alias or os.path.basename(model)
        self.behaviour = behaviour
        self.keys = keys
        self.ctx_size = ctx_size
        self.token_delay_s = float(behaviour["token_delay_s"])
        self.prompt_delay_s = float(behaviour["prompt_delay_s"])
        self.ready = threading.Event()
        self.hung = threading.Event()
        self.ignore_sigterm = False
        self.last_prompt: list[str] = []  # a prefix cache, as llama-server keeps: one word, one token

    def cached(self, words: list[str]) -> int:
        """Words of ``words`` the previous prompt began with (the last one is always processed)."""
        same = 0
        for mine, theirs in zip(words[:-1], self.last_prompt, strict=False):
            if mine != theirs:
                break
            same += 1
        self.last_prompt = words
        return same

    def template_caps(self) -> dict[str, bool] | None:
        caps = self.behaviour["template_caps"]
        if caps is None and self.behaviour["tool_call"]:
            return {"supports_tools": True, "supports_tool_calls": True}
        return caps if isinstance(caps, dict) else None

    def tool_call(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The call this reply makes, if any (``tool_call``, bounded by ``tool_rounds``)."""
        call, rounds = self.behaviour["tool_call"], self.behaviour["tool_rounds"]
        if not call or (rounds is not None and len(_tool_results(body)) >= rounds):
            return None
        return dict(call)

    def pieces(self, max_tokens: int | None, body: dict[str, Any] | None = None) -> tuple[list[str], str]:
        reply = self.behaviour["reply"]
        messages = (body or {}).get("messages") or [{}]
        last = messages[-1] if isinstance(messages[-1], dict) else {}
        if self.behaviour["tool_rounds"] is not None and last.get("role") == "tool":
            reply = "tool said: " + str(last.get("content", ""))[:200]
        if reply is not None:
            words = str(reply).split(" ")
            pieces = [w + " " for w in words[:-1]] + [words[-1]]
        else:
            pieces = [f"tok{i} " for i in range(int(self.behaviour["tokens"]))]
        if max_tokens is not None and max_tokens < len(pieces):
            return pieces[:max_tokens], "length"
        return pieces, "stop"

    def block_if_hung(self) -> None:
        if self.hung.is_set():
            threading.Event().wait()  # forever: a hung engine answers nothing


def _timings(
    prompt_n: int, prompt_ms: float, predicted_n: int, predicted_ms: float, cache_n: int = 0
) -> dict[str, Any]:
    return {
        "cache_n": cache_n,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / max(prompt_n, 1),
        "prompt_per_second": 1000.0 * prompt_n / prompt_ms if prompt_ms else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / max(predicted_n, 1),
        "predicted_per_second": 1000.0 * predicted_n / predicted_ms if predicted_ms else 0.0,
    }


def _tool_results(body: dict[str, Any]) -> list[str]:
    messages = body.get("messages") or []
    return [str(m.get("content", "")) for m in messages if isinstance(m, dict) and m.get("role") == "tool"]


def _prompt_words(body: dict[str, Any]) -> list[str]:
    if "messages" in body:
        text = " ".join(str(m.get("content") or "") for m in body["messages"] if isinstance(m, dict))
    else:
        text = str(body.get("prompt", ""))
    return text.split() or [""]


CONNECTIONS = itertools.count(1)  # numbers the connections accepted (next() is atomic under the GIL)


class Handler(BaseHTTPRequestHandler):
    server_version = "llama.cpp-standin"
    protocol_version = "HTTP/1.1"
    standin: Standin  # set on the class before serving

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the request lines are printed llama-server's way in _log_request

    def setup(self) -> None:
        super().setup()
        self.connection_number = next(CONNECTIONS)
        self.requests_on_connection = 0

    def _log_request(self, status: int) -> None:
        say(f"srv  log_server_r: request: {self.command} {self.path} 127.0.0.1 {status}")
        self.requests_on_connection += 1
        k, c = self.requests_on_connection, self.connection_number
        say(f"standin: {self.command} {self.path} is request {k} on connection {c}")

    # --- plumbing ---

    def _json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self._log_request(status)

    def _error(self, status: int, message: str, kind: str) -> None:
        self._json(status, {"error": {"code": status, "message": message, "type": kind}})

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return {}
        return body if isinstance(body, dict) else {}

    def _authorised(self) -> bool:
        if not self.standin.keys or self.path.split("?")[0] in PUBLIC:
            return True
        return self.headers.get("Authorization", "") in {f"Bearer {k}" for k in self.standin.keys}

    def _sse(self, payload: Any) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        self.wfile.write(f"data: {data}\n\n".encode())
        self.wfile.flush()

    # --- routes ---

    def do_GET(self) -> None:
        s = self.standin
        s.block_if_hung()
        path = self.path.split("?")[0]
        if path in ("/health", "/v1/health"):
            if s.ready.is_set():
                self._json(200, {"status": "ok"})
            else:
                self._error(503, "Loading model", "unavailable_error")
        elif not self._authorised():
            self._error(401, "Invalid API Key", "authentication_error")
        elif not s.ready.is_set():
            self._error(503, "Loading model", "unavailable_error")
        elif path == "/props" and (caps := s.template_caps()) is not None:
            self._json(200, {"chat_template_caps": caps})
        elif path in ("/models", "/v1/models"):
            model = {"id": s.model_id, "object": "model", "created": 0, "owned_by": "llamacpp"}
            self._json(200, {"object": "list", "data": [model]})
        else:
            self._error(404, "File Not Found", "not_found_error")

    def do_POST(self) -> None:
        s = self.standin
        if self.path.startswith(CONTROL):
            self._control(self.path[len(CONTROL) :])
            return
        s.block_if_hung()
        body = self._body()
        if not self._authorised():
            self._error(401, "Invalid API Key", "authentication_error")
        elif not s.ready.is_set():
            self._error(503, "Loading model", "unavailable_error")
        elif self.path in ("/v1/chat/completions", "/chat/completions"):
            self._complete(body, chat=True)
        elif self.path in ("/v1/completions", "/completions"):
            self._complete(body, chat=False)
        else:
            self._error(404, "File Not Found", "not_found_error")

    def _control(self, action: str) -> None:
        s = self.standin
        body = self._body()
        if action not in ("crash", "hang", "ignore_sigterm", "slow"):
            self._error(404, f"unknown control {action!r}", "not_found_error")
            return
        if action == "slow":
            s.token_delay_s = float(body.get("token_delay_s", s.token_delay_s))
        elif action == "ignore_sigterm":
            # Before the answer: a caller that sends SIGTERM as soon as it has it must find it ignored.
            s.ignore_sigterm = True
            say("standin: ignoring SIGTERM from now on")
        self._json(200, {"ok": action})
        if action == "crash":
            say("fatal: simulated crash")
            os._exit(1)
        elif action == "hang":
            say("standin: hanging now (no more answers, /health included)")
            s.hung.set()

    def _complete(self, body: dict[str, Any], *, chat: bool) -> None:
        s = self.standin
        max_tokens = body.get("max_tokens", body.get("n_predict"))
        pieces, finish = s.pieces(
            max_tokens if isinstance(max_tokens, int) and max_tokens >= 0 else None, body if chat else None
        )
        call = s.tool_call(body) if chat else None
        words = _prompt_words(body)
        prompt_n = len(words)  # the whole prompt, as ``usage`` counts it
        cache_n = s.cached(words)
        kind = "chat.completion" if chat else "text_completion"
        rid = f"chatcmpl-standin{time.monotonic_ns()}"
        started = time.perf_counter()
        prompt_ms = 0.05 * (prompt_n - cache_n)
        inline_thought = body.get("reasoning_format") == "none"
        if not body.get("stream"):
            for _ in pieces:
                self._pause()
            predicted_ms = (time.perf_counter() - started) * 1000.0
            text = "".join(pieces)
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
                if thought := s.behaviour["reasoning"]:
                    if inline_thought:
                        choice["message"]["content"] = f"<think>{thought}</think>{text}"
                    else:
                        choice["message"]["reasoning_content"] = thought
                if call:
                    function = {"name": call["name"], "arguments": call["arguments"]}
                    choice["message"]["tool_calls"] = [
                        {"id": "call_standin", "type": "function", "function": function}
                    ]
                    choice["finish_reason"] = "tool_calls"
            else:
                choice["text"] = text
            self._json(
                200,
                {
                    "id": rid,
                    "object": kind,
                    "created": int(time.time()),
                    "model": s.model_id,
                    "choices": [choice],
                    "usage": {
                        "prompt_tokens": prompt_n,
                        "completion_tokens": len(pieces),
                        "total_tokens": prompt_n + len(pieces),
                    },
                    "timings": _timings(prompt_n - cache_n, prompt_ms, len(pieces), predicted_ms, cache_n),
                },
            )
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        chunk_kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta: dict[str, Any] | str, finish_reason: str | None) -> dict[str, Any]:
            part: dict[str, Any] = {"index": 0, "finish_reason": finish_reason}
            if chat:
                part["delta"] = delta
            else:
                part["text"] = delta
            return {
                "id": rid,
                "object": chunk_kind,
                "created": int(time.time()),
                "model": s.model_id,
                "choices": [part],
            }

        try:
            time.sleep(s.prompt_delay_s)
            if chat:
                self._sse(chunk({"role": "assistant", "content": None}, None))
            if chat and (thought := s.behaviour["reasoning"]):
                words = re.findall(r"\S+\s*", str(thought))  # a word at a time, its space kept
                field = "content" if inline_thought else "reasoning_content"
                for word in ["<think>", *words, "</think>"] if inline_thought else words:
                    self._sse(chunk({field: word}, None))
            for piece in pieces:
                self._pause()
                self._sse(chunk({"content": piece} if chat else piece, None))
            for n in range(int(s.behaviour["calls_at_once"]) if call else 0):
                assert call is not None
                start = {"index": n, "id": f"call_standin{n or ''}", "type": "function"}
                self._sse(
                    chunk(
                        {"tool_calls": [{**start, "function": {"name": call["name"], "arguments": ""}}]}, None
                    )
                )
                arguments = str(call["arguments"])
                for at in range(0, len(arguments), 5):
                    part = {"index": n, "function": {"arguments": arguments[at : at + 5]}}
                    self._sse(chunk({"tool_calls": [part]}, None))
                finish = "tool_calls"
            predicted_ms = (time.perf_counter() - started) * 1000.0
            last = chunk({} if chat else "", finish)
            last["timings"] = _timings(prompt_n - cache_n, prompt_ms, len(pieces), predicted_ms, cache_n)
            self._sse(last)
            options = body.get("stream_options")
            if isinstance(options, dict) and options.get("include_usage"):
                usage = chunk({} if chat else "", None)
                usage["choices"] = []
                usage["usage"] = {
                    "prompt_tokens": prompt_n,
                    "completion_tokens": len(pieces),
                    "total_tokens": prompt_n + len(pieces),
                }
                self._sse(usage)
            self._sse("[DONE]")
        except (BrokenPipeError, ConnectionResetError):
            say("srv  cancel_tasks: the client closed the connection")
            return
        self._log_request(200)

    def _pause(self) -> None:
        s = self.standin
        if s.token_delay_s > 0:
            time.sleep(s.token_delay_s)
        s.block_if_hung()


def read_behaviour(model: str) -> dict[str, Any]:
    behaviour = dict(DEFAULTS)
    sidecar = Path(model + SIDECAR_SUFFIX)
    if sidecar.exists():
        given = json.loads(sidecar.read_text())
        unknown = set(given) - set(DEFAULTS)
        if unknown:
            say(f"standin: warning: unknown sidecar keys {sorted(unknown)}")
        behaviour.update(given)
    return behaviour


def read_keys(path: str | None) -> set[str]:
    if not path:
        return set()
    try:
        return {line.strip() for line in Path(path).read_text().splitlines() if line.strip()}
    except OSError as err:
        say(f"main: failed to read the API key file {path}: {err.strerror}")
        sys.exit(1)


def main(argv: list[str]) -> int:
    if "--version" in argv:
        print(VERSION_LINE)
        print("built with python for the Lemon Desk tests")
        return 0
    args = parse_args(argv)
    model = args.get("model", "")
    port = int(args.get("port", "8080"))
    host = args.get("host", "127.0.0.1")
    keys = read_keys(args.get("api_key_file"))
    say("build: 4242 (standin) with python for the Lemon Desk tests")
    say(f"system info: n_threads = 1, stand-in engine, pid {os.getpid()}")
    try:
        with open(model, "rb") as f:
            magic = f.read(4)
    except OSError as err:
        say(f"gguf_init_from_file: failed to open GGUF file '{model}' ({err.strerror})")
        say(f"llama_model_load: error loading model: failed to open {model}")
        say("main: exiting due to model loading error")
        return 1
    if magic != b"GGUF":
        say(f"gguf_init_from_file_impl: invalid magic characters: '{magic.decode('latin-1')}'")
        say("llama_model_load: error loading model: llama_model_loader: failed to load model")
        say("main: exiting due to model loading error")
        return 1
    behaviour = read_behaviour(model)
    standin = Standin(model, behaviour, keys, int(args.get("ctx_size", "4096")), args.get("alias", ""))
    Handler.standin = standin
    if behaviour["http10"]:
        Handler.protocol_version = "HTTP/1.0"

    def on_sigterm(signum: int, frame: object) -> None:
        if standin.ignore_sigterm:
            say("standin: SIGTERM received and ignored")
            return
        say("srv    operator(): operator(): cleaning up before exit...")
        os._exit(0)

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, on_sigterm)
    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as err:
        say(f"start: couldn't bind HTTP server socket, hostname: {host}, port: {port}: {err.strerror}")
        return 1
    server.daemon_threads = True
    say(f"main: HTTP server is listening, hostname: {host}, port: {port}, http threads: 4")
    say("main: loading model")
    say(f"srv    load_model: loading model '{model}'")

    def load() -> None:
        time.sleep(float(behaviour["load_delay_s"]))
        if behaviour["crash_on_load"]:
            say("llama_model_load: error loading model: standin: simulated load failure (crash_on_load)")
            say("main: exiting due to model loading error")
            os._exit(3)
        say(f"llama_context: n_ctx = {standin.ctx_size}")
        say("main: model loaded")
        say(f"main: server is listening on http://{host}:{port} - starting the main loop")
        say("srv  update_slots: all slots are idle")
        standin.ready.set()

    threading.Thread(target=load, name="load", daemon=True).start()
    server.serve_forever(poll_interval=0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
