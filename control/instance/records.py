"""The kvsp extension records between the PC, the instance and the front end (docs/pc-instance-protocol.md).

The spec leaves inference requests out of scope (section 1.3); these are the shapes of the contract:

    StartSession = {"session": uuid, "epoch": int, "scope_id", "compat_id", "prompt": [uint32...],
                    "max_tokens": int, "sampler": {"method","params","seed","step","deterministic"}}
    TokenEvent   = {"index": int, "epoch": int, "token": uint32}          one JSON object per line
                 | {"end": true, "reason": "max_tokens"|"stop", "epoch": int}   the last line
    Ack          = {"session", "epoch", "output_offset"}                  the PC's answer to a checkpoint

The body of POST sessions/{session}/resume is a Session Checkpoint; it may carry the extension member
``"max_tokens"`` (the session's total output budget), which spec-only parsers ignore.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Self

from control.instance.core import OutputToken
from kvsp._reader import ObjectReader
from kvsp.encoding import canonical_json, parse_json
from kvsp.errors import ValidationError
from kvsp.records import Sampler, SessionCheckpoint
from kvsp.records._common import (
    COMPAT_ID_OCTETS,
    MAX_SAFE_INT,
    MAX_UINT32,
    SCOPE_ID_OCTETS,
    JsonRecord,
    read_count,
    read_positive,
    read_uuid,
)
from kvsp.records.session import MAX_TOKENS

END_REASONS: Final = frozenset({"max_tokens", "stop"})


@dataclass(frozen=True, slots=True)
class StartSession(JsonRecord):
    """Body of POST sessions/{session}/start (PC only)."""

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
            prompt=r.int_list("prompt", maximum=MAX_UINT32, max_items=MAX_TOKENS, nonempty=True),
            max_tokens=read_positive(r, "max_tokens"),
            sampler=Sampler.from_reader(r.object("sampler")),
        )

    def to_json(self) -> dict[str, object]:
        return {"session": self.session, "epoch": self.epoch, "scope_id": self.scope_id.hex(),
                "compat_id": self.compat_id.hex(), "prompt": list(self.prompt), "max_tokens": self.max_tokens,
                "sampler": self.sampler.to_json()}


@dataclass(frozen=True, slots=True)
class ResumeSession:
    """Body of POST sessions/{session}/resume: the checkpoint at the new epoch, and the optional budget."""

    checkpoint: SessionCheckpoint
    max_tokens: int | None = None

    @classmethod
    def from_json(cls, value: object) -> ResumeSession:
        checkpoint = SessionCheckpoint.from_json(value)
        r = ObjectReader(value)
        max_tokens = r.optional("max_tokens", lambda n: read_positive(r, n))
        if max_tokens is not None and max_tokens < checkpoint.output_offset:
            raise ValidationError("max_tokens", "must not be below output_offset")
        return cls(checkpoint, max_tokens)

    def to_bytes(self) -> bytes:
        body = self.checkpoint.to_json()
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        return canonical_json(body)


@dataclass(frozen=True, slots=True)
class CheckpointAck(JsonRecord):
    """The PC recorded a checkpoint of ``session`` covering ``output_offset`` tokens at ``epoch``."""

    session: str
    epoch: int
    output_offset: int

    @classmethod
    def from_reader(cls, r: ObjectReader) -> Self:
        return cls(read_uuid(r, "session"), read_count(r, "epoch"), read_count(r, "output_offset"))

    def to_json(self) -> dict[str, object]:
        return {"session": self.session, "epoch": self.epoch, "output_offset": self.output_offset}


@dataclass(frozen=True, slots=True)
class EndLine:
    """The last line of a token stream: no more tokens at this epoch."""

    reason: str
    epoch: int


TokenLine = OutputToken | EndLine


def token_line(token: OutputToken) -> bytes:
    """One NDJSON line (with its newline) for a token."""
    return canonical_json({"index": token.index, "epoch": token.epoch, "token": token.token}) + b"\n"


def end_line(end: EndLine) -> bytes:
    return canonical_json({"end": True, "reason": end.reason, "epoch": end.epoch}) + b"\n"


def parse_token_line(line: bytes | str) -> TokenLine:
    """Decode one line of a token stream (the front end's side)."""
    r = ObjectReader(parse_json(line))
    if r.has("end"):
        if r.bool("end") is not True:
            raise ValidationError("end", "must be true")
        return EndLine(r.choice("reason", END_REASONS), read_count(r, "epoch"))
    return OutputToken(read_count(r, "index"), read_count(r, "epoch"), r.int("token", maximum=MAX_UINT32))
