"""The kvsp extension records the instance reads and writes (docs/pc-instance-protocol.md).

StartSession, the resume body, and the token stream's lines are defined once, in
`kvsp.records.generation`, and shared with the PC; this module gives them the instance's names and
adds the PC's answer to a checkpoint:

    Ack = {"session", "epoch", "output_offset"}     the PC recorded a checkpoint covering output_offset

The body of POST sessions/{session}/resume is a Session Checkpoint; it may carry the extension member
``"max_tokens"`` (the session's total output budget), which spec-only parsers ignore.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Self

from kvsp.reader import ObjectReader
from kvsp.records.base import JsonRecord, read_count, read_uuid
from kvsp.records.generation import (
    END_REASONS,
    ResumeRequest,
    StartSession,
    StreamEnd,
    StreamLine,
    TokenEvent,
    parse_stream_line,
)

__all__ = ["END_REASONS", "CheckpointAck", "EndLine", "ResumeSession", "StartSession", "TokenLine", "end_line",
           "parse_token_line", "token_line"]

ResumeSession = ResumeRequest  # the instance's name for the resume body
EndLine = StreamEnd  # the last line of a token stream
TokenLine = StreamLine
parse_token_line = parse_stream_line  # decode one line of a token stream (the front end's side)


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


def token_line(token: TokenEvent) -> bytes:
    """One NDJSON line (with its newline) for a token."""
    return token.to_line()


def end_line(end: StreamEnd) -> bytes:
    return end.to_line()
