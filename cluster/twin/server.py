"""The head's HTTP surface: the part of vLLM's OpenAI server the orchestrator uses.

``/health`` (503 until the boot is done), ``/v1/models`` (answers from the start, as vLLM's
does while loading), ``/version``, ``/metrics`` (Prometheus text, vLLM's names), and
``/v1/completions`` / ``/v1/chat/completions`` with SSE streaming (``data: {…}`` then
``data: [DONE]``), ``stream_options.include_usage`` and vLLM's ``continuous_usage_stats``.
Generation is always greedy (the twin has one text per prompt) and always runs to
``max_tokens`` (finish reason ``length``).
"""

from __future__ import annotations

import json
import queue
import select
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cluster import prompts
from cluster.stall import ENGINE_STALL_METRIC
from cluster.twin import text
from cluster.twin.engine import Chunk, Counters, Engine, Request
from cluster.twin.log import EngineLog

VLLM_VERSION = "0.11.1"

#: Default ``max_tokens`` of a chat request that sets none (vLLM would use the whole context).
CHAT_DEFAULT_MAX_TOKENS = 256


@dataclass
class ServerState:
    """What the handlers need; ``engine`` is set when the boot completes."""

    served_model_name: str
    model_path: str
    max_model_len: int
    k: int
    engine: Engine | None = None
    created: int = 0
    #: where each completion request is logged, as vLLM logs them with --enable-log-requests
    requests_log: EngineLog | None = None

    @property
    def ready(self) -> bool:
        """Whether the boot is complete (``/health`` answers 200)."""
        return self.engine is not None


class _BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


#: One Prometheus metric: name, type, help text, and its samples (extra labels, value).
_Metric = tuple[str, str, str, list[tuple[str, float]]]


def metrics_text(state: ServerState, counters: Counters | None) -> str:
    """``/metrics`` in Prometheus text format, vLLM v1 names (counters end in ``_total``)."""
    c = counters or Counters(per_position=[0] * state.k)
    labels = f'engine="0",model_name="{state.served_model_name}"'
    metrics = _engine_metrics(c) + (_spec_decode_metrics(c) if state.k > 0 else [])
    lines = [line for metric in metrics for line in _metric_lines(labels, *metric)]
    return "\n".join(lines) + "\n"


def _metric_lines(
    labels: str, name: str, kind: str, help_text: str, samples: list[tuple[str, float]]
) -> list[str]:
    """One metric's ``# HELP`` and ``# TYPE`` lines and its samples."""
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    suffix = "_total" if kind == "counter" else ""
    for extra, value in samples:
        lab = labels + ("," + extra if extra else "")
        lines.append(f"{name}{suffix}{{{lab}}} {float(value)}")
    return lines


def _engine_metrics(c: Counters) -> list[_Metric]:
    """The scheduler's gauges and the token and request counters."""
    return [
        (
            "vllm:num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            [("", c.running)],
        ),
        (
            "vllm:num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            [("", c.waiting)],
        ),
        (
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            [("", min(1.0, (c.running + c.waiting) / 64.0))],
        ),
        (
            "vllm:prompt_tokens",
            "counter",
            "Number of prefill tokens processed.",
            [("", c.prompt_tokens)],
        ),
        (
            "vllm:generation_tokens",
            "counter",
            "Number of generation tokens processed.",
            [("", c.generation_tokens)],
        ),
        (
            "vllm:request_success",
            "counter",
            "Count of successfully processed requests.",
            [('finished_reason="length"', c.requests_ok)],
        ),
        (
            "vllm:num_preemptions",
            "counter",
            "Cumulative number of preemption from the engine.",
            [("", 0)],
        ),
        (
            # the twin's own, not vLLM's: a bench cell reads it as the engine host's stall
            # (cluster.bench: such a cell is measured again, as for a stalled client)
            ENGINE_STALL_METRIC,
            "counter",
            "Seconds the twin's scheduler woke later than a delivery was due (its host was busy).",
            [("", c.stall_s)],
        ),
    ]


def _spec_decode_metrics(c: Counters) -> list[_Metric]:
    """The speculative-decoding counters (only when the engine drafts, k > 0)."""
    return [
        (
            "vllm:spec_decode_num_drafts",
            "counter",
            "Number of spec decoding drafts.",
            [("", c.drafts)],
        ),
        (
            "vllm:spec_decode_num_draft_tokens",
            "counter",
            "Number of draft tokens.",
            [("", c.draft_tokens)],
        ),
        (
            "vllm:spec_decode_num_accepted_tokens",
            "counter",
            "Number of accepted tokens.",
            [("", c.accepted)],
        ),
        (
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "counter",
            "Accepted tokens per draft position.",
            [(f'position="{i}"', v) for i, v in enumerate(c.per_position)],
        ),
    ]


@dataclass(frozen=True)
class _StreamIds:
    """The fields every chunk of one stream repeats."""

    id: str
    object: str
    created: int
    model: str

    def payload(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        """A chunk with these fields and ``choices``."""
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }


#: A chat stream's first chunk's choice: the assistant's role, no content yet.
_ROLE_CHOICE: dict[str, Any] = {
    "index": 0,
    "delta": {"role": "assistant", "content": ""},
    "logprobs": None,
    "finish_reason": None,
}


def _sse(payload: object) -> bytes:
    """One ``data: …`` event (JSON, or ``payload`` as is when bytes) as an HTTP chunk."""
    data = (
        b"data: "
        + (payload if isinstance(payload, bytes) else json.dumps(payload).encode())
        + b"\n\n"
    )
    return f"{len(data):X}\r\n".encode() + data + b"\r\n"


def _usage(req: Request, total: int) -> dict[str, int]:
    """OpenAI ``usage`` after ``total`` generated tokens of ``req``."""
    return {
        "prompt_tokens": req.prompt_tokens,
        "total_tokens": req.prompt_tokens + total,
        "completion_tokens": total,
    }


def _delta_payload(
    ids: _StreamIds, chunks: list[Chunk], req: Request, *, chat: bool, continuous: bool
) -> dict[str, Any]:
    """The stream chunk carrying ``chunks``' tokens (with running usage when ``continuous``)."""
    tokens = tuple(t for c in chunks for t in c.tokens)
    last = chunks[-1]
    reason = "length" if last.finished else None
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason}
    if chat:
        choice["delta"] = {"content": text.join(tokens)}
    else:
        choice["text"] = text.join(tokens)
        choice["stop_reason"] = None
    payload = ids.payload([choice])
    if continuous:
        payload["usage"] = _usage(req, last.total)
    return payload


def _stream_end(ids: _StreamIds, req: Request, total: int, *, usage: bool) -> bytes:
    """What follows the last token chunk: the usage chunk if asked for, ``[DONE]``, the end."""
    out = b""
    if usage:
        out += _sse({**ids.payload([]), "usage": _usage(req, total)})
    return out + _sse(b"[DONE]") + b"0\r\n\r\n"


class Handler(BaseHTTPRequestHandler):
    """One connection; HTTP/1.1 keep-alive, chunked SSE for streams."""

    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    @property
    def state(self) -> ServerState:
        server = self.server
        assert isinstance(server, TwinHTTPServer)
        return server.state

    def setup(self) -> None:
        super().setup()
        self.opened_at = time.monotonic()  # the engine's clock
        # SSE chunks are small writes; Nagle + delayed ACK would hold them for 40 ms
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        return  # vLLM logs requests only with --enable-log-requests

    # ---- plumbing --------------------------------------------------------------------------
    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, payload: object) -> None:
        self._send(status, json.dumps(payload).encode())

    def _error(self, status: int, message: str, kind: str) -> None:
        self._json(
            status, {"error": {"message": message, "type": kind, "param": None, "code": status}}
        )

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return bool(self.connection.recv(1, socket.MSG_PEEK) == b"")
        except OSError:
            return True

    # ---- GET -------------------------------------------------------------------------------
    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        state = self.state
        if path == "/health":
            self._send(200 if state.ready else 503, b"")
        elif path == "/v1/models":
            self._json(
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": state.served_model_name,
                            "object": "model",
                            "created": state.created,
                            "owned_by": "vllm",
                            "root": state.model_path,
                            "parent": None,
                            "max_model_len": state.max_model_len,
                        }
                    ],
                },
            )
        elif path == "/version":
            self._json(200, {"version": VLLM_VERSION})
        elif path == "/metrics":
            counters = state.engine.snapshot() if state.engine is not None else None
            self._send(
                200,
                metrics_text(state, counters).encode(),
                "text/plain; version=0.0.4; charset=utf-8",
            )
        else:
            self._error(404, f"Not Found: {path}", "NotFoundError")

    # ---- POST ------------------------------------------------------------------------------
    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self._error(404, f"Not Found: {path}", "NotFoundError")
            return
        engine = self.state.engine
        if engine is None:
            self._error(503, "The server is still starting up.", "ServiceUnavailableError")
            return
        try:
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise _BadRequest("the request body must be a JSON object")
            chat = path == "/v1/chat/completions"
            prompt, max_tokens = self._parse(body, chat)
        except json.JSONDecodeError as e:
            self._error(400, f"invalid JSON body: {e.msg}", "BadRequestError")
            return
        except _BadRequest as e:
            self._error(e.status, str(e), e.kind)
            return
        if self.state.requests_log is not None:
            self.state.requests_log.info(
                "logger.py:39",
                f"Received request: prompt: {prompt[:80]!r}, params: max_tokens={max_tokens}",
            )
        req = engine.submit(prompt, max_tokens, opened_at=self.opened_at)
        opts = body.get("stream_options") or {}
        if body.get("stream"):
            self._stream(
                engine,
                req,
                chat,
                bool(opts.get("include_usage")),
                bool(opts.get("continuous_usage_stats")),
            )
        else:
            self._whole(engine, req, chat)

    def _parse(self, body: dict[str, Any], chat: bool) -> tuple[str, int]:
        state = self.state
        model = body.get("model", state.served_model_name)
        if model != state.served_model_name:
            raise _BadRequest(f"The model `{model}` does not exist.", 404, "NotFoundError")
        if body.get("n", 1) != 1:
            raise _BadRequest("the twin serves n=1 only")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise _BadRequest("messages must be a non-empty list")
            parts: list[str] = []
            for m in messages:
                content = m.get("content") if isinstance(m, dict) else None
                if isinstance(content, list):
                    content = " ".join(
                        str(p.get("text", "")) for p in content if isinstance(p, dict)
                    )
                if not isinstance(content, str):
                    raise _BadRequest("every message needs a string content")
                parts.append(content)
            prompt = prompts.SEPARATOR.join(parts)
            raw_max = body.get(
                "max_completion_tokens", body.get("max_tokens", CHAT_DEFAULT_MAX_TOKENS)
            )
        else:
            prompt_field = body.get("prompt")
            if isinstance(prompt_field, list) and len(prompt_field) == 1:
                prompt_field = prompt_field[0]
            if not isinstance(prompt_field, str):
                raise _BadRequest("prompt must be a string")
            prompt = prompt_field
            raw_max = body.get("max_tokens", 16)
        if raw_max is None:
            raw_max = CHAT_DEFAULT_MAX_TOKENS if chat else 16
        if not isinstance(raw_max, int) or isinstance(raw_max, bool) or raw_max < 1:
            raise _BadRequest(f"max_tokens must be a positive integer, not {raw_max!r}")
        used = prompts.count_tokens(prompt)
        if used + raw_max > state.max_model_len:
            raise _BadRequest(
                f"This model's maximum context length is {state.max_model_len} tokens. However, "
                f"you requested {used + raw_max} tokens ({used} in the messages, {raw_max} in the "
                "completion). Please reduce the length of the messages or completion."
            )
        return prompt, raw_max

    def _next(self, engine: Engine, req: Request) -> list[Chunk] | None:
        """The chunks ready for ``req`` (waiting for one); ``None`` when the client went away."""
        while True:
            try:
                first = req.out.get(timeout=0.01)
                break
            except queue.Empty:  # check on the client, then keep waiting
                if self._client_gone():
                    engine.abort(req)
                    return None
        chunks = [first]
        while not chunks[-1].finished:
            try:
                chunks.append(req.out.get_nowait())
            except queue.Empty:
                break
        return chunks

    def _stream(
        self, engine: Engine, req: Request, chat: bool, usage: bool, continuous: bool
    ) -> None:
        ids = _StreamIds(
            id=("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
            created=int(time.time()),
            object="chat.completion.chunk" if chat else "text_completion",
            model=self.state.served_model_name,
        )
        self._start_sse()
        try:
            if chat:
                self.wfile.write(_sse(ids.payload([_ROLE_CHOICE])))
            while True:
                chunks = self._next(engine, req)
                if chunks is None:
                    return
                last = chunks[-1]
                out = _sse(_delta_payload(ids, chunks, req, chat=chat, continuous=continuous))
                if self._client_gone():
                    engine.abort(req)
                    self.close_connection = True
                    return
                if last.finished:
                    out += _stream_end(ids, req, last.total, usage=usage)
                self.wfile.write(out)
                if last.finished:
                    return
        except OSError:
            engine.abort(req)
            self.close_connection = True

    def _start_sse(self) -> None:
        """A 200 with chunked ``text/event-stream`` headers (the events follow)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _whole(self, engine: Engine, req: Request, chat: bool) -> None:
        state = self.state
        tokens: list[str] = []
        total = 0
        while True:
            chunks = self._next(engine, req)
            if chunks is None:
                self.close_connection = True
                return
            for c in chunks:
                tokens.extend(c.tokens)
                total = c.total
            if chunks[-1].finished:
                break
        content = text.join(tokens)
        usage = _usage(req, total)
        created = int(time.time())
        if chat:
            payload: dict[str, Any] = {
                "id": "chatcmpl-" + uuid.uuid4().hex,
                "object": "chat.completion",
                "created": created,
                "model": state.served_model_name,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "logprobs": None,
                        "finish_reason": "length",
                        "stop_reason": None,
                    }
                ],
                "usage": usage,
            }
        else:
            payload = {
                "id": "cmpl-" + uuid.uuid4().hex,
                "object": "text_completion",
                "created": created,
                "model": state.served_model_name,
                "choices": [
                    {
                        "index": 0,
                        "text": content,
                        "logprobs": None,
                        "finish_reason": "length",
                        "stop_reason": None,
                    }
                ],
                "usage": usage,
            }
        try:
            self._json(200, payload)
        except OSError:
            self.close_connection = True


class TwinHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server carrying the shared ``ServerState``."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], state: ServerState) -> None:
        self.state = state
        super().__init__(address, Handler)


def start_server(
    host: str, port: int, state: ServerState
) -> tuple[TwinHTTPServer, threading.Thread]:
    """Bind and serve in a daemon thread.

    Raises:
        OSError: the address cannot be bound (e.g. the port is taken).
    """
    server = TwinHTTPServer((host, port), state)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="twin-http", daemon=True
    )
    thread.start()
    return server, thread
