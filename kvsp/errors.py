"""Exception hierarchy of the KVSP core.

One root (`KvspError`) for the whole package.  Input errors are `ValueError`s too, so callers that
only know the standard library still catch them.  Errors that map to an HTTP problem type carry it,
and are turned into Problem Details in exactly one place (the HTTP adapters).
"""

from __future__ import annotations


class KvspError(Exception):
    """Root of every error raised by kvsp."""


class ValidationError(KvspError, ValueError):
    """A JSON document, descriptor or parameter violates a KVSP rule.

    ``member`` is the JSON path of the offending member (``"residency[1].layers"``) and ``rule`` says
    which rule it broke, so an operator can fix the input without reading code.
    """

    def __init__(self, member: str, rule: str) -> None:
        super().__init__(f"{member}: {rule}")
        self.member = member
        self.rule = rule


class ContainerError(KvspError, ValueError):
    """A KV Block Container is malformed or does not match its geometry."""


class DigestMismatchError(KvspError, ValueError):
    """Data does not match the digest that describes it (problem type kvsp-digest-mismatch)."""
