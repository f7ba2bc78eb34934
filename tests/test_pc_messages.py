"""The kvsp extension records of the PC (docs/pc-instance-protocol.md) and the outbound client's URLs."""

from __future__ import annotations

import pytest

from control.pc.client import InstanceClient
from control.pc.messages import GenerateRequest, SessionInfo, SessionState, StartSession
from kvsp.errors import ValidationError
from kvsp.records import Sampler

SID = "6f1d0a9e-2c55-4d7e-9a0e-5b7f2f9f6a11"
SCOPE, COMPAT = "6d1c6481cd428737da312c089db3832a", "5e" * 32


def request(**changes: object) -> dict[str, object]:
    body: dict[str, object] = {"scope_id": SCOPE, "compat_id": COMPAT, "prompt": [1, 2, 3], "max_tokens": 4,
                               "sampler": {"method": "top-p", "params": {"p": 0.9}, "seed": 7}}
    body.update(changes)
    return body


def test_generate_request_is_parsed_with_defaults() -> None:
    parsed = GenerateRequest.from_json(request(extra="ignored"))
    assert parsed.session is None and parsed.prompt == (1, 2, 3) and parsed.max_tokens == 4
    assert parsed.sampler == Sampler("top-p", (("p", 0.9),), 7, 0, False)
    greedy = GenerateRequest.from_json(request(session=SID, sampler={"method": "greedy"}))
    assert greedy.session == SID and greedy.sampler == Sampler("greedy", (), 0, 0, False)
    assert GenerateRequest.from_json(parsed.to_json()) == parsed


@pytest.mark.parametrize(("changes", "member"), [
    ({"session": SID.upper()}, "session"),
    ({"scope_id": "00"}, "scope_id"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [2**32]}, "prompt[0]"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"sampler": {"method": "beam"}}, "sampler.method"),
    ({"sampler": {"method": "greedy", "seed": -1}}, "sampler.seed"),
    ({"sampler": "greedy"}, "sampler"),
], ids=["session", "scope", "empty-prompt", "token", "max-tokens", "method", "seed", "sampler-type"])
def test_bad_generate_requests_name_the_member(changes: dict[str, object], member: str) -> None:
    with pytest.raises(ValidationError) as info:
        GenerateRequest.from_json(request(**changes))
    assert info.value.member == member


def test_start_session_and_session_info_round_trip() -> None:
    start = StartSession(SID, 1, bytes.fromhex(SCOPE), bytes.fromhex(COMPAT), (5, 6), 3,
                         Sampler("greedy", (), 0, 0, True))
    assert StartSession.from_bytes(start.to_bytes()) == start
    assert start.to_json()["sampler"] == {"method": "greedy", "params": {}, "seed": 0, "step": 0,
                                          "deterministic": True}
    info = SessionInfo(SID, None, 2, 5, SessionState.STRANDED)
    assert SessionInfo.from_bytes(info.to_bytes()) == info
    assert info.to_json()["instance"] is None


def test_instance_client_urls_and_timeout() -> None:
    assert InstanceClient.url("https://ii.example/kvsp/", "prefetch") == "https://ii.example/kvsp/prefetch"
    assert InstanceClient.url("https://ii.example/kvsp", "state") == "https://ii.example/kvsp/state"
    with pytest.raises(ValueError):
        InstanceClient(None, timeout_s=0)  # type: ignore[arg-type]
