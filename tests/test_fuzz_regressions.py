"""What the fuzzing campaign found (docs/fuzzing.md), one test per fix, and every crashing input kept
under fuzz/regressions/ (named ``<target>-<what>``) replayed through its harness.
"""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path

import cbor2
import pytest

from fuzz import fuzz_moqt_auth as auth_harness
from kvsp.container import Geometry, LayerRange
from kvsp.descriptor import MAX_EXTRA_DEPTH, CompatDescriptor
from kvsp.errors import KvspError, ValidationError
from kvsp.moqt_binding import BlockAssembly, LayerCheck, layer_object
from kvsp.problems import Problem
from kvsp.registry import Codec
from moqt import SessionTerminated
from moqt.auth import MalformedTokenError, verify_token
from moqt.kinds import FilterType
from moqt.messages import PublishDone, SubscribeError, SubscribeOk, decode_message
from moqt.messages.subscribe import filter_start
from moqt.profiles import DRAFT_14
from moqt.testing import established_session, feed_control
from moqt.tracks import MoqtObject, check_fetch, fetch_ok_end, fetch_stop
from moqt.wire import MAX_REASON_PHRASE_LENGTH, VARINT_MAX, Location, Reader, Writer, pull_reason_phrase
from relay.core import ObjectCache

REGRESSIONS = Path(__file__).resolve().parent.parent / "fuzz" / "regressions"
CASES = sorted(p.name for p in REGRESSIONS.iterdir()) if REGRESSIONS.is_dir() else []


@pytest.mark.parametrize("name", CASES)
def test_crashing_input_now_holds_the_contract(name: str) -> None:
    target = name.split("-", 1)[0]
    harness = importlib.import_module(f"fuzz.fuzz_{target}")
    harness.test_one_input((REGRESSIONS / name).read_bytes())


# -- problem: a Problem Details body without "title" ------------------------------------------------
def test_problem_without_title_round_trips() -> None:
    """RFC 9457 makes ``title`` optional; we read its absence as "" and write "", which must parse."""
    problem = Problem.from_bytes(b'{"type": "https://example.com/x", "status": 429}')
    assert problem.title == ""
    assert Problem.from_bytes(problem.to_bytes()) == problem
    assert Problem.from_bytes(b'{"status": 404, "title": ""}').title == ""


# -- moqt_wire / moqt_messages: a reason phrase of undecodable octets ----------------------------
def test_undecodable_reason_phrase_can_be_sent_on() -> None:
    """Each bad octet became U+FFFD (three octets), so 1,024 of them read as 3,072 octets of text, and a
    relay passing the reason on (SUBSCRIBE_ERROR, PUBLISH_DONE) raised ValueError while encoding it."""
    writer = Writer()
    writer.push_length_prefixed(b"\xff" * MAX_REASON_PHRASE_LENGTH)
    reason = pull_reason_phrase(Reader(writer.getvalue()))
    assert len(reason.encode()) <= MAX_REASON_PHRASE_LENGTH and set(reason) == {"\ufffd"}
    payload = b"\x00\x10" + writer.getvalue()  # Request ID 0, Error Code 0x10, the reason
    message = decode_message(DRAFT_14.message_types.code(SubscribeError.KIND), payload)
    assert isinstance(message, SubscribeError)
    SubscribeError(5, message.error_code, message.reason).encode()  # what the relay sends downstream
    PublishDone(5, 0, 1, message.reason).encode()
    assert pull_reason_phrase(Reader(b"\x05hello")) == "hello"


# -- relay_core: a FETCH up to the last group the wire can name ------------------------------------
def test_fetch_to_the_last_group_is_a_range() -> None:
    """End Location (2**62-1, 0) means all of the last group: "plus 1" used to overflow the varint range
    (ValueError from Location) in the relay's cache and the publisher's range check."""
    assert fetch_stop(Location(VARINT_MAX, 0)) == Location(VARINT_MAX, VARINT_MAX)
    assert fetch_stop(Location(3, 0)) == Location(4, 0) and fetch_stop(Location(3, 2)) == Location(3, 2)
    assert check_fetch(Location(0, 0), Location(VARINT_MAX, 0), Location(2, 0)) is None
    cache = ObjectCache(1024, ttl_s=10.0)
    key = ((b"kvsp",), b"raw")
    objects = [MoqtObject(0, 0, memoryview(b"ab"))]
    assert cache.store(key, Location(0, 0), Location(VARINT_MAX, 0), objects, 0.0, ok_end=Location(VARINT_MAX, 0),
                       end_of_track=False)
    hit = cache.lookup(key, Location(0, 0), Location(VARINT_MAX, 0), 1.0)
    assert hit is not None and [o.location for o in hit.objects] == [Location(0, 0)]


# -- moqt_binding: a refused layer must not change the checks of the next one -----------------------
GEOMETRY = Geometry(kv_heads=1, head_dim=2, element_size=2)  # 4 octets a token and section


def raw_layer(layer: int, tokens: int) -> bytes:
    return bytes((layer + i) & 0xFF for i in range(2 * GEOMETRY.section_length(tokens)))


def test_refused_first_layer_does_not_fix_the_token_count() -> None:
    """A raw block's first layer gives the token count; a refused one (here: one token too many, bad
    digest) used to set it anyway, so the right layer was then refused for its size."""
    good = raw_layer(0, 1)
    check = LayerCheck(Codec.RAW, LayerRange(0, 0), (hashlib.sha256(good).digest(),), None, GEOMETRY)
    with pytest.raises(KvspError):
        check.check(layer_object(0, raw_layer(0, 2), 8, Codec.RAW))
    assert check.token_count is None and check.expected == 0
    assert bytes(check.check(layer_object(0, good, 4, Codec.RAW)).payload) == good
    assert check.token_count == 1


def test_refused_copy_does_not_move_the_allocator() -> None:
    """A caller's own object is copied into the block buffer before it is checked; a refused one used to
    move the allocator past its slot, so the next layer, delivered in place, was read from the wrong
    octets and refused."""
    layers = [raw_layer(i, 1) for i in range(2)]
    check = LayerCheck(Codec.RAW, LayerRange(0, 1), tuple(hashlib.sha256(p).digest() for p in layers), 1, GEOMETRY)
    assembly = BlockAssembly(check, capacity=sum(map(len, layers)))
    with pytest.raises(KvspError):
        assembly.accept(MoqtObject(0, 0, memoryview(layers[0][:-1] + b"\x00\x00\x00")))  # 10 octets, bad digest
    assembly.accept(layer_object(0, layers[0], 4, Codec.RAW))  # the right layer, a caller's copy
    slot = assembly.allocate(0, 1, len(layers[1]))  # the next one as the subscriber delivers it
    assert slot is not None
    slot[:] = layers[1]
    assert bytes(assembly.accept(layer_object(1, slot, 4, Codec.RAW)).payload) == layers[1]
    assert [bytes(v.payload) for v in assembly.finish().layers] == layers


# -- moqt_auth: whitespace in a token's scope ID ---------------------------------------------------------
@pytest.mark.parametrize("scope", ["ab" * 12 + "\n" * 6 + "ab", "00 11 22 33 44 55 66 77 88 99 aa"[:32]])
def test_token_scope_id_with_whitespace_is_refused(scope: str) -> None:
    """``bytes.fromhex`` skips whitespace, so a 32-character scope claim with spaces or newlines became a
    scope ID shorter than 16 octets that the verifier accepted."""
    claims = {1: "kvsp", 2: "https://client.example/", 4: auth_harness.NOW + 60, 6: auth_harness.NOW,
              -65537: [scope]}
    token = auth_harness.sign(auth_harness.PROTECTED, cbor2.dumps(claims))
    assert len(scope) == 32
    with pytest.raises(MalformedTokenError, match="32 lowercase hex digits"):
        verify_token(token, auth_harness.TRUSTED, auth_harness.NOW)
    claims[-65537] = ["ab" * 16]
    good = verify_token(auth_harness.sign(auth_harness.PROTECTED, cbor2.dumps(claims)), auth_harness.TRUSTED,
                        auth_harness.NOW)
    assert good.scopes == frozenset({b"\xab" * 16})


# -- moqt_session: a Largest Location at the varint's end ---------------------------------------------
def test_subscribe_ok_with_the_last_object_id_keeps_the_session() -> None:
    """A SUBSCRIBE_OK whose Largest Location has Object ID 2**62-1: the next Location was computed as
    object + 1, a ValueError inside ``handle_event``, so the session closed with INTERNAL_ERROR."""
    session, quic = established_session(is_client=True)
    rid = session.subscribe((b"kvsp",), b"raw")
    events = feed_control(session, SubscribeOk(rid, 1, 0, largest_location=Location(3, VARINT_MAX)).encode())
    assert quic.close_args is None and not any(isinstance(e, SessionTerminated) for e in events)
    assert filter_start(FilterType.LARGEST_OBJECT, None, Location(3, VARINT_MAX)) == Location(4, 0)
    assert filter_start(FilterType.NEXT_GROUP_START, None, Location(VARINT_MAX, 2)) == Location(VARINT_MAX, VARINT_MAX)
    assert filter_start(FilterType.LARGEST_OBJECT, None, Location(3, 7)) == Location(3, 8)
    assert fetch_ok_end(Location(9, 0), Location(2, VARINT_MAX)) == Location(3, 0)


# -- descriptor: unknown members that JCS cannot write, or nested to the parser's limit -------------------
APPENDIX_A_TEXT = (Path(__file__).resolve().parent / "vectors" / "appendix_a_descriptor.json").read_text().strip()


def with_member(text: str) -> bytes:
    return (APPENDIX_A_TEXT[:-1] + ', "x-extension": ' + text + "}").encode()


@pytest.mark.parametrize("member", ['{"\\udeff": 1}', '"\\udeff"'])
def test_descriptor_member_with_a_lone_surrogate_is_refused(member: str) -> None:
    """Unknown members are kept for the Compatibility ID; a lone surrogate in a member name made rfc8785
    raise UnicodeEncodeError (not its own error), which escaped as a bare ValueError."""
    with pytest.raises(ValidationError, match="JCS"):
        CompatDescriptor.from_bytes(with_member(member))


def test_descriptor_nested_unknown_member_is_bounded() -> None:
    """JSON nested nearly as deep as the parser allows parsed, then ran out of stack (RecursionError) when
    the descriptor wrote its unknown member again for the ID."""
    # How deep the parser goes depends on the stack in use, so every depth up to its limit is tried.
    for depth in range(MAX_EXTRA_DEPTH + 1, 1001):
        with pytest.raises(ValidationError):
            CompatDescriptor.from_bytes(with_member("[" * depth + "]" * depth))
    ok = CompatDescriptor.from_bytes(with_member("[" * 32 + "1" + "]" * 32))
    assert CompatDescriptor.from_bytes(ok.canonical()).compat_id == ok.compat_id
