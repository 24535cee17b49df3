"""The OpenAI completions wire format the twin speaks, as vLLM's server speaks it.

The one home of what a request may ask (``parse_request``: the served model, ``n=1``, a prompt
or chat messages, ``max_tokens`` within the context, vLLM's error texts) and of what the
answers look like: SSE stream chunks (``data: {…}`` then ``data: [DONE]``), their usage with
``include_usage`` or vLLM's ``continuous_usage_stats``, and a whole response. Every answer ends
at ``max_tokens`` (finish reason ``length``).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cluster import prompts
from cluster.twin import text
from cluster.twin.engine import Chunk, Request

if TYPE_CHECKING:
    from cluster.twin.server import ServerState

#: Default ``max_tokens`` of a chat request that sets none (vLLM would use the whole context).
CHAT_DEFAULT_MAX_TOKENS = 256


class BadRequest(Exception):
    """A request the twin refuses: its message, HTTP status and OpenAI error type."""

    def __init__(self, message: str, status: int = 400, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


def parse_request(state: ServerState, body: dict[str, Any], chat: bool) -> tuple[str, int]:
    """The prompt and ``max_tokens`` of a request's JSON body.

    Raises:
        BadRequest: another model, ``n`` other than 1, no prompt or messages, a
            ``max_tokens`` that is not a positive integer, or more tokens than the context.
    """
    model = body.get("model", state.served_model_name)
    if model != state.served_model_name:
        raise BadRequest(f"The model `{model}` does not exist.", 404, "NotFoundError")
    if body.get("n", 1) != 1:
        raise BadRequest("the twin serves n=1 only")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        parts: list[str] = []
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list):
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            if not isinstance(content, str):
                raise BadRequest("every message needs a string content")
            parts.append(content)
        prompt = prompts.SEPARATOR.join(parts)
        raw_max = body.get("max_completion_tokens", body.get("max_tokens", CHAT_DEFAULT_MAX_TOKENS))
    else:
        prompt_field = body.get("prompt")
        if isinstance(prompt_field, list) and len(prompt_field) == 1:
            prompt_field = prompt_field[0]
        if not isinstance(prompt_field, str):
            raise BadRequest("prompt must be a string")
        prompt = prompt_field
        raw_max = body.get("max_tokens", 16)
    if raw_max is None:
        raw_max = CHAT_DEFAULT_MAX_TOKENS if chat else 16
    if not isinstance(raw_max, int) or isinstance(raw_max, bool) or raw_max < 1:
        raise BadRequest(f"max_tokens must be a positive integer, not {raw_max!r}")
    used = prompts.count_tokens(prompt)
    if used + raw_max > state.max_model_len:
        raise BadRequest(
            f"This model's maximum context length is {state.max_model_len} tokens. However, "
            f"you requested {used + raw_max} tokens ({used} in the messages, {raw_max} in the "
            "completion). Please reduce the length of the messages or completion."
        )
    return prompt, raw_max


@dataclass(frozen=True)
class StreamIds:
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


def stream_ids(model: str, *, chat: bool) -> StreamIds:
    """A new stream's fields (a fresh id, created now)."""
    return StreamIds(
        id=("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
        created=int(time.time()),
        object="chat.completion.chunk" if chat else "text_completion",
        model=model,
    )


#: A chat stream's first chunk's choice: the assistant's role, no content yet.
ROLE_CHOICE: dict[str, Any] = {
    "index": 0,
    "delta": {"role": "assistant", "content": ""},
    "logprobs": None,
    "finish_reason": None,
}


def sse(payload: object) -> bytes:
    """One ``data: …`` event (JSON, or ``payload`` as is when bytes) as an HTTP chunk."""
    data = (
        b"data: "
        + (payload if isinstance(payload, bytes) else json.dumps(payload).encode())
        + b"\n\n"
    )
    return f"{len(data):X}\r\n".encode() + data + b"\r\n"


def usage_of(req: Request, total: int) -> dict[str, int]:
    """OpenAI ``usage`` after ``total`` generated tokens of ``req``."""
    return {
        "prompt_tokens": req.prompt_tokens,
        "total_tokens": req.prompt_tokens + total,
        "completion_tokens": total,
    }


def delta_payload(
    ids: StreamIds, chunks: list[Chunk], req: Request, *, chat: bool, continuous: bool
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
        payload["usage"] = usage_of(req, last.total)
    return payload


def stream_end(ids: StreamIds, req: Request, total: int, *, usage: bool) -> bytes:
    """What follows the last token chunk: the usage chunk if asked for, ``[DONE]``, the end."""
    out = b""
    if usage:
        out += sse({**ids.payload([]), "usage": usage_of(req, total)})
    return out + sse(b"[DONE]") + b"0\r\n\r\n"


def whole_payload(model: str, content: str, usage: dict[str, int], *, chat: bool) -> dict[str, Any]:
    """The answer to a request that does not stream: ``content`` whole, with its usage."""
    created = int(time.time())
    if chat:
        payload: dict[str, Any] = {
            "id": "chatcmpl-" + uuid.uuid4().hex,
            "object": "chat.completion",
            "created": created,
            "model": model,
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
            "model": model,
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
    return payload
