"""The OpenAI completions shape, sans-I/O: parse and check a request, build answers and SSE events.

    POST /v1/completions   {"model", "prompt": "text" | [ids], "max_tokens" = 16, "temperature" = 1.0,
                            "top_p" = 1.0, "seed" = 0, "stream" = false, "user"?}

``temperature`` 0 is greedy sampling (deterministic: a session moved to another instance continues
with exactly the tokens of an uninterrupted run); otherwise top-p sampling with ``top_p`` and
``temperature``.  Members this front end does not implement (``n`` > 1, ``logprobs``, ``echo``,
``suffix``, ``best_of``, ``stop``, ``logit_bias``, penalties) are refused with 400 rather than ignored,
so a client never gets an answer to a question it did not ask.

Errors are Problem Details (RFC 9457) that also carry OpenAI's ``error`` member, so both kinds of
client read them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from control.frontend.tokenizer import Tokenizer
from kvsp.encoding import parse_json
from kvsp.errors import ValidationError
from kvsp.problems import PROBLEM_MEDIA_TYPE

MEDIA_PROBLEM: Final = PROBLEM_MEDIA_TYPE
UNSUPPORTED: Final = ("suffix", "logprobs", "echo", "best_of", "stop", "logit_bias", "presence_penalty",
                      "frequency_penalty")
KNOWN: Final = frozenset({"model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stream", "user", "n",
                          "stream_options", *UNSUPPORTED})
MAX_SEED: Final = 2**53 - 1
MAX_USER: Final = 256


class ApiError(Exception):
    """An answer other than success: HTTP status, title, detail, OpenAI error type and offending member;
    ``fields`` are header fields the status needs (``WWW-Authenticate`` on 401, ``Allow`` on 405)."""

    def __init__(self, status: int, title: str, detail: str, *, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, fields: Mapping[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail = status, title, detail
        self.kind, self.param, self.code = kind, param, code
        self.fields: dict[str, str] = dict(fields or {})

    def to_json(self) -> dict[str, object]:
        return {"type": "about:blank", "status": self.status, "title": self.title, "detail": self.detail,
                "error": {"message": self.detail, "type": self.kind, "param": self.param, "code": self.code}}

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":")).encode()


def bad(detail: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, "Bad Request", detail, param=param, code=code)


@dataclass(frozen=True, slots=True)
class Limits:
    model: str
    max_prompt_tokens: int
    max_tokens_limit: int


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    prompt: tuple[int, ...]
    max_tokens: int
    method: str  # "greedy" | "top-p"
    params: tuple[tuple[str, float], ...]
    seed: int
    stream: bool
    include_usage: bool


def parse_completion(body: bytes, limits: Limits, tokenizer: Tokenizer) -> CompletionRequest:
    """Check a request body; every refusal is an `ApiError` naming the member."""
    doc = _object(body)
    unknown = sorted(set(doc) - KNOWN)
    if unknown:
        raise bad(f"unknown member {unknown[0]!r}", unknown[0])
    for name in UNSUPPORTED:
        if doc.get(name) not in (None, False, 0):
            raise bad(f"{name!r} is not supported by this server", name, "unsupported_parameter")
    if doc.get("n", 1) != 1:
        raise bad("only n = 1 is supported", "n", "unsupported_parameter")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise bad("'model' is required (a string)", "model")
    if model != limits.model:
        raise ApiError(404, "Not Found", f"the model {model[:100]!r} does not exist; this server has "
                       f"{limits.model!r}", param="model", code="model_not_found")
    prompt = _prompt(doc.get("prompt"), limits, tokenizer)
    max_tokens = _int(doc, "max_tokens", 16, 1, limits.max_tokens_limit)
    temperature = _number(doc, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(doc, "top_p", 1.0, 0.0, 1.0)
    seed = _int(doc, "seed", 0, 0, MAX_SEED)
    stream = _bool(doc, "stream")
    if doc.get("user") is not None and (not isinstance(doc["user"], str) or len(doc["user"]) > MAX_USER):
        raise bad(f"'user' must be a string of at most {MAX_USER} characters", "user")
    options = doc.get("stream_options")
    if options is not None and (not isinstance(options, dict) or not stream):
        raise bad("'stream_options' must be an object, with stream = true", "stream_options")
    include_usage = bool(options.get("include_usage")) if isinstance(options, dict) else False
    if temperature == 0.0:
        return CompletionRequest(prompt, max_tokens, "greedy", (), seed, stream, include_usage)
    if top_p == 0.0:
        raise bad("'top_p' must be above 0 (use temperature 0 for greedy decoding)", "top_p")
    params = (("p", top_p), ("temperature", temperature))
    return CompletionRequest(prompt, max_tokens, "top-p", params, seed, stream, include_usage)


def _object(body: bytes) -> dict[str, object]:
    # The JSON reader of every KVSP role: malformed text, and nesting too deep to parse, are input errors.
    try:
        doc = parse_json(body)
    except ValidationError as exc:
        raise bad(f"the body is not valid JSON ({exc.rule[:120]})") from exc
    if not isinstance(doc, dict):
        raise bad("the body must be a JSON object")
    return doc


def _prompt(value: object, limits: Limits, tokenizer: Tokenizer) -> tuple[int, ...]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]  # OpenAI's batch form with one prompt
    if isinstance(value, str):
        # A character encodes to at least one token's worth of text: refuse huge strings before encoding.
        if len(value) > limits.max_prompt_tokens * 64:
            raise _too_long(len(value), limits, "characters")
        if not _is_text(value):
            raise bad("'prompt' must be Unicode text: it has a lone surrogate", "prompt")
        tokens = tokenizer.encode(value)
    elif isinstance(value, list) and all(type(t) is int for t in value):
        tokens = list(value)
        vocab = tokenizer.vocab_size
        if any(not 0 <= t < vocab for t in tokens):
            raise bad(f"token ids must lie in [0, {vocab})", "prompt")
    else:
        raise bad("'prompt' must be a string or an array of token ids", "prompt")
    if not tokens:
        raise bad("'prompt' must not be empty", "prompt")
    if len(tokens) > limits.max_prompt_tokens:
        raise _too_long(len(tokens), limits, "tokens")
    return tuple(tokens)


def _is_text(value: str) -> bool:
    """Whether ``value`` is Unicode scalar values only.  JSON's \\ud800 escapes (and the surrogates
    the reader passes through) give strings no tokenizer can encode; I-JSON (RFC 7493) forbids them."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _too_long(size: int, limits: Limits, unit: str) -> ApiError:
    return ApiError(413, "Content Too Large", f"the prompt has {size} {unit}; at most {limits.max_prompt_tokens} "
                    "tokens are accepted", param="prompt", code="context_length_exceeded")


def _int(doc: dict[str, object], name: str, default: int, low: int, high: int) -> int:
    value = doc.get(name)
    if value is None:
        return default
    if type(value) is not int or not low <= value <= high:
        raise bad(f"{name!r} must be an integer in [{low}, {high}]", name)
    return value


def _number(doc: dict[str, object], name: str, default: float, low: float, high: float) -> float:
    value = doc.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not low <= value <= high:
        raise bad(f"{name!r} must be a number in [{low}, {high}]", name)
    return float(value)


def _bool(doc: dict[str, object], name: str) -> bool:
    value = doc.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad(f"{name!r} must be true or false", name)
    return value


# -- answers -------------------------------------------------------------------------------------------
def completion_id(session: str) -> str:
    return "cmpl-" + session


def chunk(session: str, model: str, created: int, text: str, *, finish: str | None = None,
          kvsp: Mapping[str, object] | None = None, usage: dict[str, int] | None = None) -> dict[str, object]:
    """One streamed ``text_completion`` object (and, with ``finish``, the last one)."""
    out: dict[str, object] = {
        "id": completion_id(session), "object": "text_completion", "created": created, "model": model,
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}],
    }
    if kvsp is not None:
        out["kvsp"] = dict(kvsp)
    if usage is not None:
        out["usage"] = usage
    return out


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def sse(event: dict[str, object] | str) -> bytes:
    """One server-sent event; ``[DONE]`` ends an OpenAI stream."""
    data = event if isinstance(event, str) else json.dumps(event, separators=(",", ":"), ensure_ascii=False)
    return b"data: " + data.encode("utf-8") + b"\n\n"


def finish_reason(end_reason: str) -> str:
    return "length" if end_reason == "max_tokens" else "stop"
