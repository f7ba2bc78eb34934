"""The seams between the PC and the instance, checked without processes: both sides speak one set of
records (kvsp.records.generation), and the pieces added to make them work together behave as the
system tests rely on (tests/test_system_failover.py, _prefetch.py, _reshard.py)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

import control.instance.core
import control.instance.records
import control.pc.messages
import kvsp.records
from control.instance.core import InstanceLifecycle, PrefetchTracker, ReportStatus
from control.instance.engines import PacedEngine, Pacing, calibrate, engine_factory
from control.instance.settings import InstanceSettings, Limits
from control.pc.core import InstanceRegistry, StatusAccepted, StatusDiscarded
from control.pc.settings import PcSettings
from kvsp.engine import greedy_sampler, top_p_sampler
from kvsp.errors import ValidationError
from kvsp.problems import ProblemType
from kvsp.records import Link, PrefetchBlock, PrefetchDirective, SessionCheckpoint
from kvsp.records.generation import ResumeRequest, StartSession, StreamEnd, TokenEvent, parse_stream_line
from kvsp.registry import InstanceState
from kvsp.service.config import RoleConfig
from tests.support.instance import COMPAT, DESCRIPTOR, PROMPT, SCOPE, keys_of, write_files

SID = "6f1d0a9e-2c55-4d7e-9a0e-5b7f2f9f6a11"
II1 = "https://ii1.example/kvsp/"
PC = "https://pc.example/kvsp/"


# -- one set of records --------------------------------------------------------------------------------
def test_both_roles_use_the_same_record_types() -> None:
    assert control.pc.messages.StartSession is control.instance.records.StartSession is kvsp.records.StartSession
    assert control.pc.messages.GenerateRequest is kvsp.records.GenerateRequest
    assert control.pc.messages.SessionInfo is kvsp.records.SessionInfo
    assert control.instance.records.ResumeSession is ResumeRequest
    assert control.instance.core.OutputToken is TokenEvent
    assert control.instance.records.EndLine is StreamEnd


def test_the_resume_body_the_pc_writes_is_the_one_the_instance_reads() -> None:
    checkpoint = SessionCheckpoint(SID, 2, COMPAT, SCOPE, tuple(keys_of(PROMPT)), PROMPT[8:], (5, 6), 2,
                                   dataclasses.replace(top_p_sampler(0.9, 7), step=2))
    body = ResumeRequest(checkpoint, 40).to_bytes()  # what control.pc.client.InstanceClient.resume sends
    assert json.loads(body)["max_tokens"] == 40
    assert control.instance.records.ResumeSession.from_json(json.loads(body)) == ResumeRequest(checkpoint, 40)
    assert SessionCheckpoint.from_bytes(body) == checkpoint  # a spec-only parser ignores the extension member
    with pytest.raises(ValueError):
        ResumeRequest(checkpoint, 1)  # below output_offset


def test_start_and_token_lines_round_trip() -> None:
    start = StartSession(SID, 1, SCOPE, COMPAT, PROMPT, 12, greedy_sampler())
    assert StartSession.from_bytes(start.to_bytes()) == start
    assert parse_stream_line(TokenEvent(3, 2, 791).to_line()) == TokenEvent(3, 2, 791)
    assert parse_stream_line(StreamEnd("max_tokens", 2).to_line()) == StreamEnd("max_tokens", 2)


# -- timing the PC and the instance must agree on ------------------------------------------------------
def test_the_pc_waits_for_a_resume_longer_than_the_instance_loads() -> None:
    assert PcSettings(index=None).resume_timeout_ms > Limits().load_timeout_ms + 1000


def test_a_fenced_incarnation_restarts_and_the_registry_takes_it_back() -> None:
    registry, life = InstanceRegistry(), InstanceLifecycle(II1, 1000)

    def status(now: float) -> kvsp.records.InstanceStatus:
        return life.make_status(running=0, queued=0, batch_size=8, kv_utilization=0.0, prefill_tokens_per_s=1e4,
                                decode_tokens_per_s=1e3, links=(), ttl_ms=3000, now=now)

    assert isinstance(registry.report(status(0.0), 0.0), StatusAccepted)
    assert [f.instance for f in registry.expire(5.0)] == [II1]  # partitioned past its ttl
    refused = registry.report(status(6.0), 6.0)
    assert isinstance(refused, StatusDiscarded) and refused.kind is ProblemType.INVALID_STATE
    assert life.on_status_refused(ProblemType.STALE_EPOCH, 2000) == []
    actions = life.on_status_refused(refused.kind, 1000)  # a clock that did not move still gives a higher epoch
    assert actions and isinstance(actions[0], ReportStatus)
    assert life.epoch == 1001 and life.state is InstanceState.ACTIVE
    back = registry.report(status(6.1), 6.1)
    assert isinstance(back, StatusAccepted) and back.state is InstanceState.ACTIVE and not back.failed


def test_a_start_finds_the_directive_sent_for_its_session() -> None:
    tracker = PrefetchTracker(PC, compat_id=COMPAT)
    directive = PrefetchDirective("a2b7c9e0-1f3d-4c1a-8f5b-6d2e9a7c3b10", SCOPE, COMPAT,
                                  (PrefetchBlock(keys_of(PROMPT)[0], ("https://h1.example/",)),), 50, 2000,
                                  request_ref=SID)
    assert tracker.for_request(SID) is None
    tracker.accept(PC, directive, 0.0)
    found = tracker.for_request(SID)
    assert found is not None and found.directive == directive.directive
    assert tracker.for_request("another") is None


# -- the engine's timing and the links the status reports ------------------------------------------------
def test_paced_engine_costs_time_per_token_and_changes_no_output() -> None:
    plain, _ = engine_factory("test", DESCRIPTOR, vocab_size=97)
    paced, _ = engine_factory("test", DESCRIPTOR, vocab_size=97, pacing=Pacing(2000, 3000))
    a, b = plain(greedy_sampler()), paced(greedy_sampler())
    assert isinstance(b, PacedEngine)
    started = time.perf_counter()
    assert b.prefill(PROMPT).token == a.prefill(PROMPT).token
    assert b.decode_step().token == a.decode_step().token
    assert time.perf_counter() - started >= (2000 * len(PROMPT) + 3000) / 1e6
    prefill, decode = calibrate(paced, DESCRIPTOR.block_tokens)
    assert 0 < prefill <= 1e6 / 2000 and 0 < decode <= 1e6 / 3000
    assert min(calibrate(plain, DESCRIPTOR.block_tokens)) > 0  # never 0: the PC could not price recompute


def test_instance_settings_read_links_and_pacing(tmp_path: Path) -> None:
    model, key = write_files(tmp_path)

    def settings(links: list[dict[str, object]]) -> InstanceSettings:
        section = {"pc": PC, "index": PC, "descriptors": [model], "scope_keys": {SCOPE.hex(): key}, "links": links,
                   "test_prefill_us_per_token": 100, "test_decode_us_per_token": 0}
        doc = {"roles": ["instance"], "server": {"base_uri": "https://127.0.0.1:1/ii/"}, "instance": section}
        return InstanceSettings.from_config(RoleConfig.from_mapping(doc, tmp_path))

    parsed = settings([{"holder": "https://h1.example/", "mbit_per_s": 800.0, "rtt_us": 50}])
    assert parsed.links == (Link("https://h1.example/", 800.0, 50),)
    assert (parsed.limits.test_prefill_us_per_token, parsed.limits.test_decode_us_per_token) == (100, 0)
    with pytest.raises(ValidationError):
        settings([{"holder": "https://h1.example/", "mbit_per_s": 0, "rtt_us": 1}])
