"""Session Checkpoint (spec sections 4.4 and 6.8): what another instance needs to resume a session.

Rules enforced beyond the member types:

- ``session`` is a UUID in canonical lowercase form (one session, one spelling in paths and maps);
- tokens (``prompt_tail``, ``generated``) are unsigned 32-bit, like the uint32() of the Block Key;
- ``output_offset`` equals ``len(generated)``: the offset is "the number of output tokens covered by
  the checkpoint" and ``generated`` must hold every covered token, because the resuming instance
  recomputes the KV cache of generated tokens not in loaded blocks and then labels new tokens from
  ``output_offset``.  Fewer tokens could not be recomputed; more would be tokens the new instance
  regenerates under the same indices, which the front end would treat as duplicates of nothing.
- ``sampler.params`` is an object of scalar values (string, finite number, boolean or null); it is
  kept as name-sorted pairs so that the record stays hashable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Self

from kvsp.errors import ValidationError
from kvsp.reader import ObjectReader
from kvsp.records.base import (
    COMPAT_ID_OCTETS,
    MAX_SAFE_INT,
    MAX_UINT32,
    SCOPE_ID_OCTETS,
    JsonRecord,
    check_text,
    hex_list,
    read_count,
    read_hex32_list,
    read_text,
    read_uuid,
)

MAX_TOKENS: Final = 1 << 22  # per token array: longer than any context window in use
MAX_PARAMS: Final = 64
MAX_PARAM_NAME: Final = 128
MAX_PARAM_STRING: Final = 1024

ParamValue = str | int | float | bool | None


def _check_param(value: object, member: str) -> ParamValue:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if -MAX_SAFE_INT <= value <= MAX_SAFE_INT:
            return value
        # Beyond the exact-integer range a JSON number is a double (RFC 7493, and JCS writes doubles
        # out in digits), so it is kept as one; otherwise it could not be written back out.
        try:
            return float(value)
        except OverflowError as exc:
            raise ValidationError(member, "must be a finite number") from exc
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValidationError(member, "must be a finite number")
        return value
    if isinstance(value, str):
        if len(value) > MAX_PARAM_STRING:
            raise ValidationError(member, f"must be at most {MAX_PARAM_STRING} characters")
        return check_text(value, member)
    raise ValidationError(member, "must be a string, number, boolean or null")


def _read_params(r: ObjectReader, name: str) -> tuple[tuple[str, ParamValue], ...]:
    value = r.raw(name)
    member = r.member(name)
    if not isinstance(value, dict):
        raise ValidationError(member, "must be a JSON object")
    if len(value) > MAX_PARAMS:
        raise ValidationError(member, f"must have at most {MAX_PARAMS} members")
    pairs: list[tuple[str, ParamValue]] = []
    for key, item in value.items():
        key_member = f"{member}.{key}"
        if len(key) > MAX_PARAM_NAME:
            raise ValidationError(key_member, f"name must be at most {MAX_PARAM_NAME} characters")
        pairs.append((check_text(key, key_member), _check_param(item, key_member)))
    return tuple(sorted(pairs, key=lambda pair: pair[0]))


@dataclass(frozen=True, slots=True)
class Sampler(JsonRecord):
    """Sampling method, parameters, seed and step, enough to restore the sampler (section 6.8 step 3)."""

    method: str
    params: tuple[tuple[str, ParamValue], ...]
    seed: int
    step: int
    deterministic: bool

    def param(self, name: str) -> ParamValue:
        """The value of parameter ``name``; KeyError when absent (None is a valid value)."""
        for key, value in self.params:
            if key == name:
                return value
        raise KeyError(name)

    @classmethod
    def from_reader(cls, r: ObjectReader) -> Self:
        return cls(read_text(r, "method", max_length=256), _read_params(r, "params"),
                   r.int("seed", maximum=MAX_SAFE_INT), read_count(r, "step"), r.bool("deterministic"))

    def to_json(self) -> dict[str, object]:
        return {"method": self.method, "params": dict(self.params), "seed": self.seed,
                "step": self.step, "deterministic": self.deterministic}


@dataclass(frozen=True, slots=True)
class SessionCheckpoint(JsonRecord):
    """Body of PUT sessions/{session}/checkpoint and of POST sessions/{session}/resume."""

    session: str
    epoch: int
    compat_id: bytes
    scope_id: bytes
    prompt_blocks: tuple[bytes, ...]
    prompt_tail: tuple[int, ...]
    generated: tuple[int, ...]
    output_offset: int
    sampler: Sampler

    @classmethod
    def from_reader(cls, r: ObjectReader) -> Self:
        generated = r.int_list("generated", maximum=MAX_UINT32, max_items=MAX_TOKENS)
        output_offset = read_count(r, "output_offset")
        if output_offset != len(generated):
            raise ValidationError(r.member("output_offset"), "must equal the number of generated tokens")
        return cls(
            session=read_uuid(r, "session"),
            epoch=read_count(r, "epoch"),
            compat_id=r.hex("compat_id", COMPAT_ID_OCTETS),
            scope_id=r.hex("scope_id", SCOPE_ID_OCTETS),
            prompt_blocks=read_hex32_list(r, "prompt_blocks", max_items=MAX_TOKENS, nonempty=False),
            prompt_tail=r.int_list("prompt_tail", maximum=MAX_UINT32, max_items=MAX_TOKENS),
            generated=generated,
            output_offset=output_offset,
            sampler=Sampler.from_reader(r.object("sampler")),
        )

    def to_json(self) -> dict[str, object]:
        return {
            "session": self.session,
            "epoch": self.epoch,
            "compat_id": self.compat_id.hex(),
            "scope_id": self.scope_id.hex(),
            "prompt_blocks": hex_list(self.prompt_blocks),
            "prompt_tail": list(self.prompt_tail),
            "generated": list(self.generated),
            "output_offset": self.output_offset,
            "sampler": self.sampler.to_json(),
        }
