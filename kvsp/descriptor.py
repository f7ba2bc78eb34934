"""Compatibility Descriptor and Compatibility ID (spec section 4.1)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Final

from kvsp.container import Geometry
from kvsp.encoding import canonical_json, format_digest, parse_json
from kvsp.errors import ValidationError
from kvsp.reader import ObjectReader
from kvsp.registry import ELEMENT_TYPES, LAYOUTS, POSITIONAL_ENCODINGS, ElementType

COMPAT_LABEL: Final = b"KVSP-COMPAT-1\x00"
KNOWN_MEMBERS: Final = frozenset({
    "model", "model_digest", "tokenizer_digest", "adapters", "layers", "kv_heads", "head_dim",
    "kv_dtype", "positional", "block_tokens", "layout",
})
# Geometry bounds: generous for any real model, small enough that products fit 64-bit lengths.
MAX_LAYERS: Final = 4096
MAX_KV_HEADS: Final = 4096
MAX_HEAD_DIM: Final = 65536
MAX_BLOCK_TOKENS: Final = 1 << 20
MAX_ADAPTERS: Final = 256
# Unknown members are kept and written again (JCS) for the ID; a bound on their nesting keeps that from
# running out of stack, which JSON nested close to the parser's own limit otherwise does.
MAX_EXTRA_DEPTH: Final = 64
_THETA: Final = re.compile(r"[1-9][0-9]{0,18}")
_SCALING: Final = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")


def check_positional(value: str, member: str = "positional") -> str:
    """``NAME`` or ``NAME;PARAMS`` from the KVSP Positional Encodings registry.

    For ``rope`` the registered parameters are ``theta=<decimal integer>`` then ``,scaling=<name>``;
    each at most once, in that order, so one configuration has one spelling (and one compat_id).
    """
    name, sep, params = value.partition(";")
    if name not in POSITIONAL_ENCODINGS:
        raise ValidationError(member, f"encoding must be one of {sorted(POSITIONAL_ENCODINGS)}")
    if not sep:
        return value
    if name != "rope":
        raise ValidationError(member, f"encoding {name!r} takes no parameters")
    seen: list[str] = []
    for param in params.split(","):
        key, eq, arg = param.partition("=")
        if not eq or key not in ("theta", "scaling"):
            raise ValidationError(member, f"parameter {param!r} must be theta=N or scaling=NAME")
        if key in seen or (key == "theta" and seen):
            raise ValidationError(member, "parameters must be theta then scaling, each at most once")
        pattern = _THETA if key == "theta" else _SCALING
        if not pattern.fullmatch(arg):
            rule = "a decimal integer without leading zeros" if key == "theta" else "a lowercase name"
            raise ValidationError(member, f"{key} must be {rule}")
        seen.append(key)
    return value


@dataclass(frozen=True, slots=True)
class CompatDescriptor:
    """A validated Compatibility Descriptor.

    Members that this version does not know are kept (``extra``, as canonical JSON text) because
    the Compatibility ID is the hash of the whole descriptor: dropping them would let two parties
    compute different IDs for the same document.
    """

    model: str
    model_digest: bytes
    tokenizer_digest: bytes
    layers: int
    kv_heads: int
    head_dim: int
    kv_dtype: str
    positional: str
    block_tokens: int
    layout: str = "kvsp-layout-1"
    adapters: tuple[bytes, ...] | None = None
    extra: tuple[tuple[str, str], ...] = ()
    compat_id: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Direct construction gets the same checks as parsing: re-read our own JSON form.
        _validate(ObjectReader(self.to_json()))
        object.__setattr__(self, "compat_id", hashlib.sha256(COMPAT_LABEL + self.canonical()).digest())

    @property
    def element(self) -> ElementType:
        return ELEMENT_TYPES[self.kv_dtype]

    def geometry(self) -> Geometry:
        """The container geometry this descriptor fixes (raw sections, layers bound)."""
        return Geometry(self.kv_heads, self.head_dim, self.element.size, self.layers)

    def section_length(self, tokens: int) -> int:
        """Octets of one K (or V) section of ``tokens`` tokens in codec raw."""
        return tokens * self.kv_heads * self.head_dim * self.element.size

    def block_octets(self) -> int:
        """Layer data octets of one whole block (all layers, K and V) in codec raw."""
        return 2 * self.layers * self.section_length(self.block_tokens)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {name: json.loads(text) for name, text in self.extra}
        out.update({
            "model": self.model, "model_digest": format_digest(self.model_digest),
            "tokenizer_digest": format_digest(self.tokenizer_digest), "layers": self.layers,
            "kv_heads": self.kv_heads, "head_dim": self.head_dim, "kv_dtype": self.kv_dtype,
            "positional": self.positional, "block_tokens": self.block_tokens, "layout": self.layout,
        })
        if self.adapters is not None:
            out["adapters"] = [format_digest(a) for a in self.adapters]
        return out

    def canonical(self) -> bytes:
        """JCS(descriptor): the octets the Compatibility ID is computed over."""
        return canonical_json(self.to_json())

    @property
    def compat_id_hex(self) -> str:
        return self.compat_id.hex()

    @classmethod
    def from_json(cls, value: object) -> CompatDescriptor:
        r = ObjectReader(value)
        fields = _validate(r)
        raw = value if isinstance(value, dict) else {}
        unknown = [(k, v) for k, v in raw.items() if k not in KNOWN_MEMBERS]
        for k, v in unknown:
            _check_depth(v, k)
        extra = tuple(sorted((k, canonical_json(v).decode()) for k, v in unknown))
        return cls(**fields, extra=extra)  # type: ignore[arg-type]

    @classmethod
    def from_bytes(cls, data: bytes | str) -> CompatDescriptor:
        return cls.from_json(parse_json(data))


def _check_depth(value: object, member: str) -> None:
    """Refuse nesting deeper than `MAX_EXTRA_DEPTH`, level by level (no recursion to run out of)."""
    level = [value]
    for _ in range(MAX_EXTRA_DEPTH):
        level = [v for item in level
                 for v in (item.values() if isinstance(item, dict) else item if isinstance(item, list) else ())]
        if not level:
            return
    raise ValidationError(member, f"must not nest more than {MAX_EXTRA_DEPTH} levels deep")


def _validate(r: ObjectReader) -> dict[str, object]:
    adapters: tuple[bytes, ...] | None = None
    if r.has("adapters"):
        # Absent means "no adapter"; an empty array would give a second spelling of the same thing.
        adapters = tuple(r.digest_items("adapters", max_items=MAX_ADAPTERS))
        if not adapters:
            raise ValidationError(r.member("adapters"), "must be absent when no adapter is applied, not empty")
    return {
        "model": r.str("model", max_length=1024),
        "model_digest": r.digest("model_digest"),
        "tokenizer_digest": r.digest("tokenizer_digest"),
        "layers": r.int("layers", minimum=1, maximum=MAX_LAYERS),
        "kv_heads": r.int("kv_heads", minimum=1, maximum=MAX_KV_HEADS),
        "head_dim": r.int("head_dim", minimum=1, maximum=MAX_HEAD_DIM),
        "kv_dtype": r.choice("kv_dtype", frozenset(ELEMENT_TYPES)),
        "positional": check_positional(r.str("positional", max_length=256), r.member("positional")),
        "block_tokens": r.int("block_tokens", minimum=1, maximum=MAX_BLOCK_TOKENS),
        "layout": r.choice("layout", LAYOUTS),
        "adapters": adapters,
    }
