"""The kvsp extension records between front end, PC and instance (docs/pc-instance-protocol.md).

Inference requests are outside KVSP (spec section 1.3); these records carry them:

    GenerateRequest = {"session": uuid (optional), "scope_id": hex16, "compat_id": hex32,
                       "prompt": [uint32...], "max_tokens": int >= 1,
                       "sampler": {"method": "greedy"|"top-p", "params": {...}, "seed": int}}
    StartSession    = {"session", "epoch", "scope_id", "compat_id", "prompt", "max_tokens",
                       "sampler": {"method", "params", "seed", "step": 0, "deterministic": bool}}
    SessionInfo     = {"session", "instance", "epoch", "output_offset", "state"}

Like every KVSP record they are frozen, slotted, parsed once through `ObjectReader` (unknown members
ignored) and written as canonical JSON.  ``sampler.params`` and ``seed`` of a GenerateRequest may be
left out (``{}`` and 0); the PC decides ``deterministic`` (``[pc] deterministic_methods``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, Self

from kvsp._reader import ObjectReader
from kvsp.errors import ValidationError
from kvsp.records._common import (
    COMPAT_ID_OCTETS,
    MAX_SAFE_INT,
    MAX_UINT32,
    SCOPE_ID_OCTETS,
    JsonRecord,
    read_uuid,
)
from kvsp.records.session import MAX_TOKENS, Sampler

SAMPLER_METHODS: Final = frozenset({"greedy", "top-p"})


class SessionState(enum.StrEnum):
    RUNNING = "running"
    FINISHED = "finished"
    STRANDED = "stranded"


def _read_sampler(r: ObjectReader, name: str) -> Sampler:
    """A Sampler from a request's ``{"method", "params"?, "seed"?}``, at step 0, not yet deterministic."""
    raw = r.raw(name)
    if not isinstance(raw, dict):
        raise ValidationError(r.member(name), "must be a JSON object")
    ObjectReader(raw, r.member(name)).choice("method", SAMPLER_METHODS)
    doc = {"params": {}, "seed": 0, **raw, "step": 0, "deterministic": False}
    return Sampler.from_reader(ObjectReader(doc, r.member(name)))


def _read_prompt(r: ObjectReader) -> tuple[int, ...]:
    return r.int_list("prompt", maximum=MAX_UINT32, max_items=MAX_TOKENS, nonempty=True)


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
            max_tokens=r.int("max_tokens", minimum=1, maximum=MAX_TOKENS),
            sampler=_read_sampler(r, "sampler"),
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
            max_tokens=r.int("max_tokens", minimum=1, maximum=MAX_TOKENS),
            sampler=Sampler.from_reader(r.object("sampler")),
        )

    def to_json(self) -> dict[str, object]:
        return {"session": self.session, "epoch": self.epoch, "scope_id": self.scope_id.hex(),
                "compat_id": self.compat_id.hex(), "prompt": list(self.prompt), "max_tokens": self.max_tokens,
                "sampler": self.sampler.to_json()}


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
