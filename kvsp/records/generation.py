"""The kvsp extension records of generation, shared by the front end, the PC and the instance.

Inference requests are outside KVSP (spec section 1.3); docs/pc-instance-protocol.md defines these
shapes, and both roles (``control.pc`` and ``control.instance``) parse and write them through this one
module, so that what the PC sends is exactly what the instance reads:

    GenerateRequest = {"session": uuid (optional), "scope_id": hex16, "compat_id": hex32,
                       "prompt": [uint32...], "max_tokens": int >= 1,
                       "sampler": {"method": "greedy"|"top-p", "params": {...}, "seed": int}}
    StartSession    = {"session", "epoch", "scope_id", "compat_id", "prompt", "max_tokens",
                       "sampler": {"method", "params", "seed", "step": 0, "deterministic": bool}}
    ResumeRequest   = SessionCheckpoint (at the new epoch) + optional extension member "max_tokens"
    SessionInfo     = {"session", "instance", "epoch", "output_offset", "state"}
    TokenEvent      = {"index": int, "epoch": int, "token": uint32}            one NDJSON line
    StreamEnd       = {"end": true, "reason": "max_tokens"|"stop", "epoch": int} the last line

Like every KVSP record they are frozen, slotted, parsed once through `ObjectReader` (unknown members
ignored) and written as canonical JSON.  ``sampler.params`` and ``seed`` of a GenerateRequest may be
left out (``{}`` and 0); the PC decides ``deterministic`` (``[pc] deterministic_methods``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, Self

from kvsp.encoding import canonical_json, parse_json
from kvsp.errors import ValidationError
from kvsp.reader import ObjectReader
from kvsp.records.base import (
    COMPAT_ID_OCTETS,
    MAX_SAFE_INT,
    MAX_UINT32,
    SCOPE_ID_OCTETS,
    JsonRecord,
    read_count,
    read_uuid,
)
from kvsp.records.session import MAX_TOKENS, Sampler, SessionCheckpoint

SAMPLER_METHODS: Final = frozenset({"greedy", "top-p"})
END_REASONS: Final = frozenset({"max_tokens", "stop"})


class SessionState(enum.StrEnum):
    RUNNING = "running"
    FINISHED = "finished"
    STRANDED = "stranded"


def _read_request_sampler(r: ObjectReader, name: str) -> Sampler:
    """A Sampler from a request's ``{"method", "params"?, "seed"?}``, at step 0, not yet deterministic."""
    raw = r.raw(name)
    if not isinstance(raw, dict):
        raise ValidationError(r.member(name), "must be a JSON object")
    ObjectReader(raw, r.member(name)).choice("method", SAMPLER_METHODS)
    doc = {"params": {}, "seed": 0, **raw, "step": 0, "deterministic": False}
    return Sampler.from_reader(ObjectReader(doc, r.member(name)))


def _read_prompt(r: ObjectReader) -> tuple[int, ...]:
    return r.int_list("prompt", maximum=MAX_UINT32, max_items=MAX_TOKENS, nonempty=True)


def _read_max_tokens(r: ObjectReader, name: str = "max_tokens") -> int:
    return r.int(name, minimum=1, maximum=MAX_TOKENS)


@dataclass(frozen=True, slots=True)
class GenerateRequest(JsonRecord):
    """Body of the extension ``POST requests``: what the front end asks the PC to run."""

    session: str | None
    scope_id: bytes
    compat_id: bytes
    prompt: tuple[int, ...]
    max_tokens: int
    sampler: Sampler  # step 0; ``deterministic`` is False here and decided by the PC

    @classmethod
    def from_reader(cls, r: ObjectReader) -> Self:
        return cls(
            session=r.optional("session", lambda n: read_uuid(r, n)),
            scope_id=r.hex("scope_id", SCOPE_ID_OCTETS),
            compat_id=r.hex("compat_id", COMPAT_ID_OCTETS),
            prompt=_read_prompt(r),
            max_tokens=_read_max_tokens(r),
            sampler=_read_request_sampler(r, "sampler"),
        )

    def to_json(self) -> dict[str, object]:
        sampler = {"method": self.sampler.method, "params": dict(self.sampler.params), "seed": self.sampler.seed}
        out: dict[str, object] = {"scope_id": self.scope_id.hex(), "compat_id": self.compat_id.hex(),
                                  "prompt": list(self.prompt), "max_tokens": self.max_tokens, "sampler": sampler}
        if self.session is not None:
            out["session"] = self.session
        return out


@dataclass(frozen=True, slots=True)
class StartSession(JsonRecord):
    """Body of the extension ``POST {instance}sessions/{session}/start`` (PC only)."""

    session: str
    epoch: int
    scope_id: bytes
    compat_id: bytes
    prompt: tuple[int, ...]
    max_tokens: int
    sampler: Sampler

    @classmethod
    def from_reader(cls, r: ObjectReader) -> Self:
        return cls(
            session=read_uuid(r, "session"),
            epoch=r.int("epoch", minimum=1, maximum=MAX_SAFE_INT),
            scope_id=r.hex("scope_id", SCOPE_ID_OCTETS),
            compat_id=r.hex("compat_id", COMPAT_ID_OCTETS),
            prompt=_read_prompt(r),
            max_tokens=_read_max_tokens(r),
            sampler=Sampler.from_reader(r.object("sampler")),
        )

    def to_json(self) -> dict[str, object]:
        return {"session": self.session, "epoch": self.epoch, "scope_id": self.scope_id.hex(),
                "compat_id": self.compat_id.hex(), "prompt": list(self.prompt), "max_tokens": self.max_tokens,
                "sampler": self.sampler.to_json()}


@dataclass(frozen=True, slots=True)
class ResumeRequest:
    """Body of ``POST {instance}sessions/{session}/resume`` (section 6.8): the checkpoint at the new
    epoch, plus the extension member ``"max_tokens"`` (the session's whole output budget), which the
    checkpoint lacks and spec-only parsers ignore (section 4.4)."""

    checkpoint: SessionCheckpoint
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens is not None and not self.checkpoint.output_offset <= self.max_tokens <= MAX_TOKENS:
            raise ValueError("max_tokens must lie between output_offset and MAX_TOKENS")

    @classmethod
    def from_json(cls, value: object) -> ResumeRequest:
        checkpoint = SessionCheckpoint.from_json(value)
        r = ObjectReader(value)
        max_tokens = r.optional("max_tokens", lambda n: _read_max_tokens(r, n))
        if max_tokens is not None and max_tokens < checkpoint.output_offset:
            raise ValidationError("max_tokens", "must not be below output_offset")
        return cls(checkpoint, max_tokens)

    @classmethod
    def from_bytes(cls, data: bytes | str) -> ResumeRequest:
        return cls.from_json(parse_json(data))

    def to_json(self) -> dict[str, object]:
        body = self.checkpoint.to_json()
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        return body

    def to_bytes(self) -> bytes:
        return canonical_json(self.to_json())


@dataclass(frozen=True, slots=True)
class SessionInfo(JsonRecord):
    """Answer of ``POST requests`` and ``GET sessions/{session}``: where the session runs now.

    ``instance`` is None (JSON null) only for a session that never had an owner the PC knows of.
    """

    session: str
    instance: str | None
    epoch: int
    output_offset: int
    state: SessionState

    @classmethod
    def from_reader(cls, r: ObjectReader) -> Self:
        instance = r.optional("instance", lambda n: r.str(n, max_length=2048))
        return cls(read_uuid(r, "session"), instance, r.int("epoch", minimum=1, maximum=MAX_SAFE_INT),
                   r.int("output_offset", maximum=MAX_SAFE_INT),
                   SessionState(r.choice("state", frozenset(s.value for s in SessionState))))

    def to_json(self) -> dict[str, object]:
        return {"session": self.session, "instance": self.instance, "epoch": self.epoch,
                "output_offset": self.output_offset, "state": self.state.value}


@dataclass(frozen=True, slots=True, order=True)
class TokenEvent:
    """One output token as the front end receives it: its index in the output and the session epoch."""

    index: int
    epoch: int
    token: int

    def to_line(self) -> bytes:
        """One NDJSON line (with its newline)."""
        return canonical_json({"index": self.index, "epoch": self.epoch, "token": self.token}) + b"\n"


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """The last line of a token stream: no more tokens at this epoch."""

    reason: str
    epoch: int

    def to_line(self) -> bytes:
        return canonical_json({"end": True, "reason": self.reason, "epoch": self.epoch}) + b"\n"


StreamLine = TokenEvent | StreamEnd


def parse_stream_line(line: bytes | str) -> StreamLine:
    """Decode one line of a token stream (the front end's side)."""
    r = ObjectReader(parse_json(line))
    if r.has("end"):
        if r.bool("end") is not True:
            raise ValidationError("end", "must be true")
        return StreamEnd(r.choice("reason", END_REASONS), read_count(r, "epoch"))
    return TokenEvent(read_count(r, "index"), read_count(r, "epoch"), r.int("token", maximum=MAX_UINT32))
