"""The relay's sans-I/O rules: prefix routing, the object cache, send queues, backoff, auth, settings
(and the holder's MOQT datagram size, the same option)."""

from __future__ import annotations

from pathlib import Path

import pytest

from control.holder.settings import HolderSettings
from kvsp.errors import ValidationError
from kvsp.identifiers import role_id
from kvsp.service.config import RoleConfig, ServerConfig
from kvsp.service.policy import Policy, ScopeGrant
from moqt.api import Action, MoqtObject, backoff_delay
from moqt.profiles import PROFILES
from moqt.quic import LOOPBACK_DATAGRAM_SIZE, QuicSettings
from moqt.wire import Location
from relay.auth import holder_of, relay_authorizer, scope_of
from relay.core import NamespaceTable, ObjectCache, RelayStats, SendQueue, TrackEnd, is_prefix
from relay.server import Relay
from relay.settings import RELAY_QUIC, RelaySettings

KEY = ((b"kvsp", b"c"), b"raw")


def obj(object_id: int, size: int = 10, group: int = 0) -> MoqtObject:
    return MoqtObject(group, object_id, memoryview(bytes(size)))


# -- routing -------------------------------------------------------------------------------------------
def test_prefix_match_is_field_by_field() -> None:
    assert is_prefix((b"foo",), (b"foo", b"bar"))
    assert is_prefix((), (b"foo",))
    assert not is_prefix((b"foo",), (b"foobar",))
    assert not is_prefix((b"foo", b"bar", b"x"), (b"foo", b"bar"))


def test_route_prefers_the_longest_prefix_and_forgets_owners() -> None:
    table: NamespaceTable[str] = NamespaceTable()
    table.add((b"a",), "short")
    table.add((b"a", b"b"), "long")
    table.add((b"a", b"b"), "long2")
    assert table.route((b"a", b"b", b"c")) == ["long", "long2", "short"]
    assert table.route((b"x",)) == []
    assert table.under((b"a",)) == [(b"a",), (b"a", b"b")]
    assert table.owner_count() == 3
    assert table.remove_owner("long") == []  # long2 still publishes (a, b)
    assert table.remove((b"a", b"b"), "long2") is True
    assert table.route((b"a", b"b")) == ["short"]
    assert table.remove_owner("short") == [(b"a",)]


# -- cache ---------------------------------------------------------------------------------------------
def test_cache_hit_only_for_a_range_fetched_completely() -> None:
    cache = ObjectCache(1000, ttl_s=10)
    objects = [obj(i) for i in range(4)]
    assert cache.lookup(KEY, Location(0, 0), Location(0, 4), now=0) is None
    assert cache.store(KEY, Location(0, 0), Location(0, 4), objects, 0, ok_end=Location(0, 4), end_of_track=False)
    hit = cache.lookup(KEY, Location(0, 1), Location(0, 3), now=1)
    assert hit is not None and [o.object_id for o in hit.objects] == [1, 2]
    assert hit.objects[0].payload is objects[1].payload  # the very view, never a copy
    assert hit.end_location == Location(0, 3) and not hit.end_of_track
    assert cache.lookup(KEY, Location(0, 0), Location(0, 5), now=1) is None  # object 4: never asked for
    assert cache.octets == 40


def test_cache_end_of_track_answers_ranges_beyond_it() -> None:
    cache = ObjectCache(1000, ttl_s=10)
    cache.store(KEY, Location(0, 0), Location(0, 100), [obj(0), obj(1)], 0, ok_end=Location(0, 2), end_of_track=True)
    hit = cache.lookup(KEY, Location(0, 0), Location(0, 100), now=0)
    assert hit is not None and len(hit.objects) == 2
    assert hit.end_location == Location(0, 2) and hit.end_of_track
    assert cache.lookup(KEY, Location(0, 5), Location(0, 9), now=0) is None  # nothing there: the publisher says so


def test_cache_merges_ranges_and_ignores_duplicates() -> None:
    cache = ObjectCache(1000, ttl_s=10)
    cache.store(KEY, Location(0, 0), Location(0, 2), [obj(0), obj(1)], 0, ok_end=Location(0, 2), end_of_track=False)
    cache.store(KEY, Location(0, 1), Location(0, 4), [obj(1, 99), obj(2), obj(3)], 0, ok_end=Location(0, 4),
                end_of_track=False)
    hit = cache.lookup(KEY, Location(0, 0), Location(0, 4), now=0)
    assert hit is not None and [o.payload.nbytes for o in hit.objects] == [10, 10, 10, 10]
    assert cache.octets == 40


def test_cache_ttl_and_lru_bound() -> None:
    cache = ObjectCache(100, ttl_s=5)
    keys = [((b"t", bytes([i])), b"raw") for i in range(3)]
    for i, key in enumerate(keys[:2]):
        cache.store(key, Location(0, 0), Location(0, 1), [obj(0, 40)], float(i), ok_end=Location(0, 1),
                    end_of_track=False)
    assert cache.lookup(keys[0], Location(0, 0), Location(0, 1), now=2) is not None  # keys[0] now most recent
    cache.store(keys[2], Location(0, 0), Location(0, 1), [obj(0, 40)], 2, ok_end=Location(0, 1), end_of_track=False)
    assert keys[1] not in cache and keys[0] in cache and cache.octets == 80
    assert cache.lookup(keys[0], Location(0, 0), Location(0, 1), now=5) is None  # stored at 0, ttl 5
    assert not cache.store(keys[1], Location(0, 0), Location(0, 1), [obj(0, 101)], 5, ok_end=Location(0, 1),
                           end_of_track=False)  # larger than the whole cache
    assert cache.octets == 40


# -- send queues ---------------------------------------------------------------------------------------
def test_send_queue_bound_ends_a_subscriber_that_falls_behind() -> None:
    queue = SendQueue(25)
    assert queue.push(obj(0)) and queue.push(obj(1))
    assert queue.pop() is not None and queue.octets == 10
    assert queue.push(obj(2))
    assert not queue.push(obj(3))  # 30 > 25
    assert queue.too_far_behind and len(queue) == 0 and queue.octets == 0
    assert not queue.push(TrackEnd())


def test_send_queue_takes_one_object_larger_than_its_bound() -> None:
    queue = SendQueue(5)
    assert queue.push(obj(0, 50)) and queue.push(TrackEnd())
    assert isinstance(queue.pop(), MoqtObject) and queue.pop() == TrackEnd() and queue.pop() is None


def test_stats_ratio_and_json() -> None:
    stats = RelayStats(cache_hits=3, cache_misses=1)
    stats.received(obj(0, 7))
    assert stats.cache_hit_ratio == 0.75
    assert stats.to_json()["bytes_in"] == 7 and stats.to_json()["cache_hit_ratio"] == 0.75
    assert RelayStats().cache_hit_ratio == 0.0


def test_backoff_grows_and_is_capped() -> None:
    delays = [backoff_delay(n, base_s=0.1, cap_s=1.0) for n in range(7)]
    assert delays == [0.0, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert backoff_delay(10_000, base_s=0.1, cap_s=2.0) == 2.0


# -- authorization ---------------------------------------------------------------------------------------
PUB = "https://pub.test/kvsp/"
READER = "https://reader.test/"
SCOPE = bytes(range(16))


def namespace(holder: str, fields: int = 5) -> tuple[bytes, ...]:
    full = (b"kvsp", bytes(32).hex().encode(), SCOPE.hex().encode(), role_id(holder).encode(), bytes(32).hex().encode())
    return full[:fields]


def test_publishers_own_their_namespaces_readers_read_their_scopes() -> None:
    policy = Policy(scopes={SCOPE: ScopeGrant(read=frozenset({READER}))},
                    publish_for={"https://delegate.test/": frozenset({PUB})})
    authorize = relay_authorizer(policy, peers=["https://peer.test/"], open_prefixes=[(b"open",)])
    assert authorize(PUB, namespace(PUB, 4), Action.PUBLISH_NAMESPACE)
    assert authorize(PUB, namespace(PUB), Action.PUBLISH_NAMESPACE)
    assert authorize("https://delegate.test/", namespace(PUB, 4), Action.PUBLISH_NAMESPACE)
    assert not authorize(READER, namespace(PUB, 4), Action.PUBLISH_NAMESPACE)
    assert not authorize(PUB, namespace(PUB, 3), Action.PUBLISH_NAMESPACE)  # would cover other producers
    assert authorize(READER, namespace(PUB), Action.FETCH) and authorize(READER, namespace(PUB, 3), Action.SUBSCRIBE)
    assert not authorize(PUB, namespace(PUB), Action.FETCH)
    assert not authorize(READER, namespace(PUB, 2), Action.SUBSCRIBE)
    assert authorize("https://peer.test/", (b"anything",), Action.PUBLISH_NAMESPACE)
    assert authorize(READER, (b"open", b"x"), Action.SUBSCRIBE)
    assert not authorize(READER, (b"openx",), Action.SUBSCRIBE)


def test_namespace_fields_are_checked() -> None:
    assert scope_of(namespace(PUB, 3)) == SCOPE
    assert scope_of((b"kvsp", b"c", b"not-hex")) is None
    assert scope_of((b"other", b"c", SCOPE.hex().encode())) is None
    assert holder_of(namespace(PUB, 4)) == role_id(PUB)
    assert holder_of(namespace(PUB, 3)) is None


# -- settings ----------------------------------------------------------------------------------------------
def config(section: dict[str, object]) -> RoleConfig:
    server = ServerConfig("https://127.0.0.1:1/r/", "127.0.0.1", 1)
    return RoleConfig(("relay",), server, None, Policy(), Path("/etc/kv"), {"relay": section})


def test_settings_parse_and_validate() -> None:
    settings = RelaySettings.from_config(config({
        "listen": "127.0.0.1:4443", "uri": "moqt://127.0.0.1:4443/relay", "upstream": ["moqt://spine:1/relay"],
        "peers": ["https://spine.test/"], "open_prefixes": ["interop/x"], "cache_octets": 0, "cache_ttl_s": 2,
        "subscriber_buffer_octets": 1000, "token_keys": ["k.pem"], "drain_s": 0.5}))
    assert (settings.host, settings.port, settings.path) == ("127.0.0.1", 4443, "/relay")
    assert settings.upstream == ("moqt://spine:1/relay",) and settings.peers == {"https://spine.test/"}
    assert settings.open_prefixes == ((b"interop", b"x"),) and settings.cache_octets == 0
    assert settings.token_keys == (Path("/etc/kv/k.pem"),) and settings.cache_ttl_s == 2.0
    base: dict[str, object] = {"listen": "127.0.0.1:1", "uri": "moqt://h:1/r"}
    bads: list[dict[str, object]] = [
        {"listen": "nope", "uri": "moqt://h:1/r"}, {**base, "uri": "https://h/"}, {**base, "cache_ttl_s": 0},
        {**base, "subscriber_buffer_octets": 0}, {**base, "open_prefixes": ["a//b"]}, {**base, "color": 1},
        {**base, "peers": ["moqt://x:1/"]}, {"uri": "moqt://h:1/r"}, {**base, "max_datagram_size": 1199},
        {**base, "max_datagram_size": 65508}, {**base, "max_datagram_size": "9000"}, {**base, "drafts": [13]},
        {**base, "drafts": []}, {**base, "drafts": "16"}]
    for bad in bads:
        with pytest.raises(ValidationError):
            RelaySettings.from_config(config(bad))


def test_settings_drafts_pin_both_legs() -> None:
    base: dict[str, object] = {"listen": "127.0.0.1:1", "uri": "moqt://h:1/r"}
    assert RelaySettings.from_config(config(base)).quic.profiles == PROFILES  # every draft, newest first
    pinned = RelaySettings.from_config(config({**base, "drafts": [14]}))
    assert pinned.drafts == (14,) and [p.draft for p in pinned.quic.profiles] == [14]


def test_settings_datagram_size_for_non_loopback_peers() -> None:
    base: dict[str, object] = {"listen": "127.0.0.1:1", "uri": "moqt://h:1/r"}
    default = RelaySettings.from_config(config(base)).quic
    assert default.datagram_size_for(("10.0.0.1", 1)) == QuicSettings().max_datagram_size
    assert default.datagram_size_for(("127.0.0.1", 1)) == LOOPBACK_DATAGRAM_SIZE
    jumbo = RelaySettings.from_config(config({**base, "max_datagram_size": 8952, "idle_timeout_s": 2})).quic
    assert jumbo.datagram_size_for(("10.0.0.1", 1)) == 8952
    assert jumbo.datagram_size_for(("::1", 1)) == LOOPBACK_DATAGRAM_SIZE
    assert (jumbo.idle_timeout_s, jumbo.recv_batch, jumbo.ack_delay_s) == (2.0, RELAY_QUIC.recv_batch,
                                                                             RELAY_QUIC.ack_delay_s)


def test_holder_moqt_datagram_size_like_the_relays() -> None:
    def holder(section: dict[str, object]) -> HolderSettings:
        server = ServerConfig("https://127.0.0.1:1/h/", "127.0.0.1", 1)
        return HolderSettings.from_config(RoleConfig(("holder",), server, None, Policy(), Path("/etc/kv"),
                                                     {"holder": section}))

    listener: dict[str, object] = {"moqt_listen": "127.0.0.1:4433", "moqt_uri": "moqt://127.0.0.1:4433/holder"}
    default = holder(listener).moqt
    assert default is not None and default.max_datagram_size == QuicSettings().max_datagram_size
    jumbo = holder({**listener, "moqt_max_datagram_size": 8952}).moqt
    assert jumbo is not None and jumbo.max_datagram_size == 8952
    bads: list[dict[str, object]] = [{**listener, "moqt_max_datagram_size": 1000},
                                     {**listener, "moqt_max_datagram_size": 70000}, {"moqt_max_datagram_size": 8952}]
    for bad in bads:
        with pytest.raises(ValidationError):
            holder(bad)


def test_a_relay_takes_requests_from_the_upstreams_it_dials_and_delegates_the_rest() -> None:
    """Over picoquic an upstream relay is known only as the URI dialled (its identity URI cannot be read):
    the relay grants that URI, normalised (default port, no fragment), what the configured policy grants
    its peers; any other identity is the policy's to decide, as before."""
    asked: list[str] = []

    def policy(identity: str, namespace: tuple[bytes, ...], action: Action) -> bool:
        asked.append(identity)
        return identity == "https://127.0.0.1:1/sub/"

    settings = RelaySettings("127.0.0.1", 0, "moqt://127.0.0.1:1/relay", upstream=("moqt://spine.test/relay#x:y",))
    authorize = Relay(settings, authorize=policy)._authorize
    namespace = (b"kvsp", b"c")
    assert authorize("moqt://spine.test:443/relay", namespace, Action.FETCH)
    assert authorize("https://127.0.0.1:1/sub/", namespace, Action.FETCH)
    assert not authorize("moqt://other.test:443/relay", namespace, Action.FETCH)
    assert asked == ["https://127.0.0.1:1/sub/", "moqt://other.test:443/relay"]
    bare = RelaySettings("127.0.0.1", 0, "moqt://127.0.0.1:1/relay")
    assert Relay(bare, authorize=policy)._authorize is policy  # no upstream: the policy alone
