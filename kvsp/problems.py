"""Problem Details (RFC 9457) with the KVSP problem types (spec section 7)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from kvsp.encoding import canonical_json, parse_json
from kvsp.errors import KvspError
from kvsp.reader import ObjectReader

PROBLEM_TYPE_BASE: Final = "https://iana.org/assignments/kvsp#"
PROBLEM_MEDIA_TYPE: Final = "application/problem+json"


class ProblemType(enum.Enum):
    """Each member's value is (suffix, recommended HTTP status, title)."""

    NOT_FOUND = ("kvsp-not-found", 404, "Block, lease, session, or directive unknown")
    SCOPE_DENIED = ("kvsp-scope-denied", 403, "Client not authorized for the scope")
    INCOMPATIBLE = ("kvsp-incompatible", 409, "Compatibility ID mismatch")
    LEASE_QUOTA = ("kvsp-lease-quota", 429, "Lease quota exceeded")
    STALE_EPOCH = ("kvsp-stale-epoch", 409, "Epoch older than current")
    INVALID_STATE = ("kvsp-invalid-state", 409, "Operation not allowed in the instance state")
    DIGEST_MISMATCH = ("kvsp-digest-mismatch", 422, "Stored data does not match its digest")
    PLAN_CONFLICT = ("kvsp-plan-conflict", 409, "Reshard plan does not match the current map version")
    LAYERS_UNAVAILABLE = ("kvsp-layers-unavailable", 404, "Requested layers not held")

    @property
    def suffix(self) -> str:
        return self.value[0]

    @property
    def status(self) -> int:
        return self.value[1]

    @property
    def title(self) -> str:
        return self.value[2]

    @property
    def uri(self) -> str:
        return PROBLEM_TYPE_BASE + self.suffix

    @classmethod
    def from_uri(cls, uri: str) -> ProblemType | None:
        return _BY_URI.get(uri)


_BY_URI: Final = {p.uri: p for p in ProblemType}


@dataclass(frozen=True, slots=True)
class Problem:
    """A Problem Details object.  ``type`` is a URI; ``about:blank`` for generic HTTP errors."""

    type: str
    status: int
    title: str
    detail: str | None = None

    @classmethod
    def of(cls, kind: ProblemType, detail: str | None = None) -> Problem:
        return cls(kind.uri, kind.status, kind.title, detail)

    @classmethod
    def generic(cls, status: int, title: str, detail: str | None = None) -> Problem:
        return cls("about:blank", status, title, detail)

    @property
    def kind(self) -> ProblemType | None:
        return ProblemType.from_uri(self.type)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"type": self.type, "status": self.status, "title": self.title}
        if self.detail is not None:
            out["detail"] = self.detail
        return out

    def to_bytes(self) -> bytes:
        return canonical_json(self.to_json())

    @classmethod
    def from_json(cls, value: object) -> Problem:
        r = ObjectReader(value)
        kind = r.optional("type", r.str) or "about:blank"
        status = r.int("status", minimum=100, maximum=599)
        # An absent title reads as "" and is written as "": both must parse (RFC 9457 makes it optional).
        title = r.optional("title", lambda n: r.str(n, nonempty=False)) or ""
        detail = r.optional("detail", lambda n: r.str(n, max_length=65536, nonempty=False))
        return cls(kind, status, title, detail)

    @classmethod
    def from_bytes(cls, data: bytes) -> Problem:
        return cls.from_json(parse_json(data))


class ProblemError(KvspError):
    """An error that an HTTP role answers with Problem Details."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.detail or problem.title)
        self.problem = problem

    @classmethod
    def of(cls, kind: ProblemType, detail: str | None = None) -> ProblemError:
        return cls(Problem.of(kind, detail))
