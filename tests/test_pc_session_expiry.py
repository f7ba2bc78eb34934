"""Regression: a session stranded for good ages out (control/pc/core/sessions.py, `_failover`).

Before the fix, every `retry_stranded` that found no instance refreshed the session's idle time, so
a session that could never be resumed stayed in the table for the life of the PC, counting against
``max_sessions``.  A retry that finds no instance is not activity; a successful move is.
"""

from __future__ import annotations

from control.pc.core import ResumeSession, SessionTable
from kvsp.records import Sampler, SessionCheckpoint

SID = "6f1d0a9e-2c55-4d7e-9a0e-5b7f2f9f6a11"
II1, II2 = "https://ii1.example/kvsp/", "https://ii2.example/kvsp/"


def stranded_table() -> SessionTable:
    table = SessionTable(idle_timeout_s=10.0)
    checkpoint = SessionCheckpoint(SID, 1, bytes(32), bytes(16), (), (1, 2), (), 0, Sampler("greedy", (), 0, 0, True))
    table.open(SID, II1, 0.0, checkpoint=checkpoint)
    table.fail_instance(II1, 1.0, lambda c, a: None)
    assert table.stranded() == [SID]
    return table


def test_stranded_session_expires_although_it_is_retried() -> None:
    table = stranded_table()
    for now in range(2, 11):
        assert table.retry_stranded(float(now), lambda c, a: None) == []
    assert table.expire(11.0) == [SID]


def test_a_successful_move_counts_as_activity() -> None:
    table = stranded_table()
    [resume] = table.retry_stranded(9.0, lambda c, a: II2)
    assert isinstance(resume, ResumeSession) and resume.checkpoint.epoch == 2
    assert table.expire(11.0) == []
    assert table.expire(19.0) == [SID]
