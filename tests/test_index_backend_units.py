"""The IS back-end's pieces that need no server: settings, key layout, the breaker, answers, withdrawal sets.

Unit tests (no sockets): the `[is]` back-end keys, the ``index`` lists of holders and the PC, the Redis
key layout (every key of a Block Key in one cluster slot), the breaker's (state, event) transitions,
`Matches` in both forms, and that the producer set a withdrawal hands the back-end is exactly what
`acts_for` admits.  The back-ends themselves are tested in tests/test_index_backend.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from control.backend import RedisConfig
from control.holder.settings import HolderSettings
from control.index.app import acts_for, withdrawable
from control.index.backend import BackendUnavailable, Matches
from control.index.redis_scripts import SCRIPTS
from control.index.redis_store import Breaker, KeyLayout, field_of
from control.index.settings import IndexSettings, parse_index_uris
from control.index.status import StatusBoard
from control.pc.settings import PcSettings
from kvsp.client.index import IndexClient, index_uris
from kvsp.errors import ValidationError
from kvsp.identifiers import role_id
from kvsp.records import InstanceStatus, Link
from kvsp.registry import InstanceState
from kvsp.service.config import RoleConfig, ServerConfig
from kvsp.service.policy import Policy
from tests.test_index_backend import R, key

IS_A, IS_B = "https://is-a.example/kvsp/", "https://is-b.example/kvsp/"


# -- settings ----------------------------------------------------------------------------------------------
def test_is_backend_defaults_to_memory_and_reads_a_redis_table(tmp_path: Path) -> None:
    assert IndexSettings.from_section({}).backend.kind == "memory"
    (tmp_path / "redis.pass").write_text("s3cret\n")
    settings = IndexSettings.from_section({"backend": "redis", "redis": {
        "url": "redis://10.0.0.5:6379/0", "cluster": True, "password_file": "redis.pass", "timeout_ms": 250,
        "key_prefix": "site1:"}}, tmp_path)
    assert settings.backend.kind == "redis"
    assert settings.backend.redis == RedisConfig(url="redis://10.0.0.5:6379/0", cluster=True, password="s3cret",
                                                 timeout_ms=250, key_prefix="site1:")


@pytest.mark.parametrize("section", [
    {"backend": "etcd"},
    {"backend": "redis"},  # no [is.redis]
    {"redis": {"url": "redis://127.0.0.1:6379/0"}},  # a table that nothing reads
    {"backend": "redis", "redis": {"url": "http://127.0.0.1:6379/"}},
    {"backend": "redis", "redis": {"url": "redis://127.0.0.1:6379/0", "password_file": "missing"}},
    {"backend": "redis", "redis": {"url": "redis://127.0.0.1:6379/0", "timeout_ms": 0}},
])
def test_bad_backend_settings_are_refused_at_startup(tmp_path: Path, section: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match=r"^is\."):
        IndexSettings.from_section(section, tmp_path)


def test_index_setting_is_one_uri_or_a_list() -> None:
    assert parse_index_uris(IS_A, "holder.index") == IS_A  # one: still a string, as before
    assert parse_index_uris([IS_A, IS_B], "holder.index") == (IS_A, IS_B)
    for bad, member in (([], "holder.index"), ([IS_A, IS_A], "holder.index"), ([IS_A, 7], "holder.index[1]"),
                        ("ftp://x/", "holder.index"), (3, "holder.index")):
        with pytest.raises(ValidationError) as exc:
            parse_index_uris(bad, "holder.index")
        assert exc.value.member == member


def test_holder_and_pc_read_index_lists(tmp_path: Path) -> None:
    server = ServerConfig("https://127.0.0.1:7443/h/", "127.0.0.1", 7443)
    holder = HolderSettings.from_config(RoleConfig(("holder",), server, None, Policy(), tmp_path,
                                                   {"holder": {"index": [IS_A, IS_B]}}))
    assert holder.index == (IS_A, IS_B)
    pc = PcSettings.from_config(RoleConfig(("pc",), server, None, Policy(), tmp_path, {"pc": {"index": [IS_B, IS_A]}}))
    assert pc.index == (IS_B, IS_A)
    with pytest.raises(ValidationError, match=r"pc\.index"):
        PcSettings.from_config(RoleConfig(("pc",), server, None, Policy(), tmp_path, {"pc": {"index": []}}))


def test_index_client_takes_one_uri_or_several() -> None:
    assert index_uris("https://is.example/kvsp") == ("https://is.example/kvsp/",)
    assert index_uris([IS_A, "https://is-b.example/x"]) == (IS_A, "https://is-b.example/x/")
    with pytest.raises(ValueError, match="at least one"):
        index_uris([])
    client = IndexClient(None, [IS_B, IS_A])  # type: ignore[arg-type]  # no request is made
    assert client.base_uri == IS_B and client.base_uris == (IS_B, IS_A)


# -- Redis key layout -----------------------------------------------------------------------------------------
def test_every_key_of_a_block_key_is_in_one_slot_and_block_keys_spread() -> None:
    layout = KeyLayout("kvsp:")
    holder, producer = role_id("https://h1.example/kvsp/"), role_id("https://h2.example/kvsp/")
    for i in range(20):
        k = key(i)
        slots = {key_slot(layout.index(k).encode()), key_slot(layout.record(k, field_of(holder, holder)).encode()),
                 key_slot(layout.record(k, field_of(holder, producer)).encode())}
        assert len(slots) == 1
    # the slot is the Block Key's (its hash tag), whatever the prefix: prompts spread over the cluster
    assert key_slot(KeyLayout("a:").index(key(0)).encode()) == key_slot(layout.index(key(0)).encode())
    assert len({key_slot(layout.index(key(i)).encode()) for i in range(64)}) > 60
    # the scripts build a record key as the index key followed by the field
    assert layout.record(key(0), holder) == layout.index(key(0)) + holder
    assert field_of(holder, holder) == holder and field_of(holder, producer) == f"{holder}/{producer}"
    assert "/" not in holder  # base64url: the separator cannot occur inside a holder-id


def test_scripts_write_their_separators_as_lua_escapes() -> None:
    """A raw tab or newline inside a Lua string literal is a compile error (or a different string)."""
    for name, text in SCRIPTS.items():
        assert "\t" not in text and "'\n'" not in text, name
        assert text.startswith(("#!lua", "\n")), name  # flags, if any, on the first line
    assert "'\\t'" in SCRIPTS["lookup"] and "'\\n'" in SCRIPTS["lookup"]


# -- the breaker: (state, event) -> state --------------------------------------------------------------------
def state(b: Breaker) -> tuple[int, float | None, str | None]:
    return b.failures, b.down_since, b.error


def test_breaker_transitions() -> None:
    b = Breaker(cooldown_s=1.0, threshold=2)
    assert b.allow(0.0) and state(b) == (0, None, None)
    b.failed(9.0, "TimeoutError")  # one slow call: still closed
    assert state(b) == (1, None, "TimeoutError") and b.allow(9.1)
    b.failed(10.0, "ConnectionError")  # two in a row: open
    assert state(b) == (2, 10.0, "ConnectionError")
    assert not b.allow(10.5)  # cooling down: fail fast
    assert b.allow(11.0)  # one try after the cool-down ...
    assert not b.allow(11.2)  # ... and only one until it is answered
    b.failed(11.3, "TimeoutError")
    assert state(b) == (3, 10.0, "TimeoutError") and not b.allow(12.0) and b.allow(12.3)
    b.succeeded()
    assert state(b) == (0, None, None) and b.allow(12.31)
    b.failed(13.0, "TimeoutError")
    b.succeeded()
    b.failed(14.0, "TimeoutError")  # not in a row: still closed
    assert b.down_since is None


# -- answers ----------------------------------------------------------------------------------------------------
def test_matches_from_records_and_from_text_agree() -> None:
    groups = [(R(0).record(), R(0, "h2").record()), (R(1).record(),)]
    from_records = Matches.of_records(groups)
    text = "\n".join("\t".join(r.to_bytes().decode() for r in g) for g in groups)  # as Redis answers
    from_text = Matches.of_text(2, text)
    assert from_text.groups() == groups and from_text.replicas_text() == from_records.replicas_text()
    assert from_text.groups()[0][0] is Matches.of_text(1, text).groups()[0][0]  # decoded once, by text
    assert Matches.of_text(0, "").groups() == [] and Matches.of_records([]).replicas_text() == ""
    assert Matches.of_text(0, "").replicas_text() == ""
    with pytest.raises(BackendUnavailable):
        Matches.of_text(1, '{"block_key":"zz"}').groups()
    with pytest.raises(ValueError, match="groups or"):
        Matches(0)


def test_board_listeners_see_what_it_accepts() -> None:
    seen: list[int] = []
    board = StatusBoard()
    board.listeners.append(lambda status: seen.append(status.epoch))
    status = InstanceStatus(instance="https://ii.example/", epoch=3, state=InstanceState.ACTIVE, running=0, queued=0,
                            batch_size=1, kv_utilization=0.0, prefill_tokens_per_s=1.0, decode_tokens_per_s=1.0,
                            links=(Link("https://h.example/", 1.0, 1),), ttl_ms=1000)
    board.put(status, 0.0)
    with pytest.raises(Exception, match="lower"):
        board.put(InstanceStatus(**{**{f: getattr(status, f) for f in status.__dataclass_fields__}, "epoch": 2}), 0.0)
    assert seen == [3]  # a refused record is not passed on


# -- withdrawal: the producer set is exactly what acts_for admits ------------------------------------------------
URIS = [f"https://h{i}.example/kvsp/" for i in range(4)]


@given(st.sampled_from(URIS), st.dictionaries(st.sampled_from(URIS), st.frozensets(st.sampled_from(URIS)), max_size=4),
       st.one_of(st.none(), st.sampled_from(URIS)))
def test_withdrawable_is_exactly_acts_for(who: str, delegations: dict[str, frozenset[str]], named: str | None) -> None:
    policy = Policy(publish_for=delegations)
    producer = None if named is None else role_id(named)
    allowed = withdrawable(policy, who, producer)
    for candidate in (role_id(u) for u in URIS):
        expected = (producer is None or candidate == producer) and acts_for(policy, who, candidate)
        assert (candidate in allowed) == expected
