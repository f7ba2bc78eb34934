"""The draft profiles (14, 16): every code point loads through them, and nothing else names their numbers.

The numbers themselves are proven by the wire vectors (test_moqt_messages, test_moqt_data,
test_moqt_draft16_*, the aiomoqt vectors); here each profile's tables are checked to be complete,
one-to-one and equal to the draft's tables, and an AST scan keeps each draft's enums inside its
profile module.
"""

from __future__ import annotations

import ast
import enum
from enum import IntEnum
from pathlib import Path
from typing import Any

import pytest

from moqt import kinds
from moqt.messages import ALL_MESSAGES, ControlMessage, Fetch, message_classes
from moqt.profiles import DRAFT_14, DRAFT_16, DRAFT_18, PROFILES, Profile
from moqt.profiles import draft14 as d14
from moqt.profiles import draft16 as d16
from moqt.profiles.base import CodeMap, DatagramForm, Layout, SessionShape, SubgroupForm
from moqt.wire import Location, Reader

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("moqt", "kvsp", "relay", "control", "interop", "benchmarks", "tests")
DRAFT_14_ENUMS = frozenset({
    "MessageType", "SetupParameterType", "VersionParameterType", "SessionErrorCode", "SubscribeErrorCode",
    "PublishDoneCode", "PublishErrorCode", "FetchErrorCode", "PublishNamespaceErrorCode",
    "SubscribeNamespaceErrorCode", "StreamResetCode", "DataStreamType", "DatagramType", "GroupOrder", "FilterType",
    "FetchType", "ObjectStatus", "AliasType"})
#: Where draft-14 numbers may be named: the profile itself, draft-16's (which reuses the tables the
#: text repeats unchanged: setup parameters, session errors, filter and fetch types, alias types) and
#: the tests that check its tables against the draft's (the data-stream vectors of test_moqt_data
#: are written in draft-14 types).
ALLOWED = frozenset({"moqt/profiles/draft14.py", "moqt/profiles/draft16.py", "moqt/profiles/draft18.py",
                     "tests/test_moqt_data.py",
                     "tests/test_moqt_profile.py"})
#: The sans-I/O core: it reads every number from the profile it was given.
CORE = ("moqt/session/", "moqt/messages/", "moqt/params.py", "moqt/params_typed.py", "moqt/wire.py", "moqt/events.py",
        "moqt/kinds.py", "moqt/errors.py", "moqt/testing.py", "moqt/data.py", "moqt/data_fields.py")

Table = tuple[str, CodeMap[Any], type[enum.Enum], type[IntEnum]]
D14_TABLES: list[Table] = [
    ("message types", DRAFT_14.message_types, kinds.MessageKind, d14.MessageType),
    ("session errors", DRAFT_14.session_errors, kinds.SessionError, d14.SessionErrorCode),
    ("PUBLISH_DONE", DRAFT_14.publish_done, kinds.PublishDoneStatus, d14.PublishDoneCode),
    ("stream resets", DRAFT_14.stream_resets, kinds.StreamReset, d14.StreamResetCode),
    ("group orders", DRAFT_14.group_orders, kinds.GroupOrder, d14.GroupOrder),
    ("filter types", DRAFT_14.filter_types, kinds.FilterType, d14.FilterType),
    ("fetch types", DRAFT_14.fetch_types, kinds.FetchType, d14.FetchType),
    ("object statuses", DRAFT_14.object_statuses, kinds.ObjectStatus, d14.ObjectStatus),
    ("alias types", DRAFT_14.alias_types, kinds.AliasType, d14.AliasType),
    ("setup parameters", DRAFT_14.setup_parameters, kinds.SetupParameter, d14.SetupParameterType),
    ("request parameters", DRAFT_14.request_parameters, kinds.RequestParameter, d14.VersionParameterType),
]
D16_TABLES: list[Table] = [
    ("message types", DRAFT_16.message_types, kinds.MessageKind, d16.MessageType),
    ("session errors", DRAFT_16.session_errors, kinds.SessionError, d14.SessionErrorCode),
    ("PUBLISH_DONE", DRAFT_16.publish_done, kinds.PublishDoneStatus, d16.PublishDoneCode),
    ("stream resets", DRAFT_16.stream_resets, kinds.StreamReset, d16.StreamResetCode),
    ("group orders", DRAFT_16.group_orders, kinds.GroupOrder, d16.GroupOrder),
    ("filter types", DRAFT_16.filter_types, kinds.FilterType, d14.FilterType),
    ("fetch types", DRAFT_16.fetch_types, kinds.FetchType, d14.FetchType),
    ("object statuses", DRAFT_16.object_statuses, kinds.ObjectStatus, d16.ObjectStatus),
    ("alias types", DRAFT_16.alias_types, kinds.AliasType, d14.AliasType),
    ("setup parameters", DRAFT_16.setup_parameters, kinds.SetupParameter, d14.SetupParameterType),
    ("message parameters", DRAFT_16.request_parameters, kinds.RequestParameter, d16.MessageParameterType),
    ("extension headers", DRAFT_16.extension_headers, kinds.ExtensionHeader, d16.ExtensionHeaderType),
    ("subscribe options", DRAFT_16.subscribe_options, kinds.SubscribeOptions, d16.SubscribeOptionsCode),
]
TABLES: list[tuple[Profile, Table]] = [(DRAFT_14, t) for t in D14_TABLES] + [(DRAFT_16, t) for t in D16_TABLES]


@pytest.mark.parametrize(("profile", "table"), TABLES, ids=[f"d{p.draft}-{t[0]}" for p, t in TABLES])
def test_every_name_has_its_code_point_both_ways(profile: Profile, table: Table) -> None:
    what, codes, names, draft = table
    assert {name.name: code for name, code in codes.codes.items()} == {m.name: int(m) for m in draft}, what
    assert set(codes.codes) == {names[m.name] for m in draft}, f"{what}: a name the draft lacks has a code"
    for name in codes.codes:
        assert codes.name(codes.code(name)) is name
    assert codes.name(max(codes.names) + 1) is None
    assert codes.code(0x77) == 0x77  # a wire integer passes through unchanged


def test_draft_14_request_error_tables_are_the_drafts() -> None:
    drafts = {kinds.MessageKind.SUBSCRIBE_ERROR: d14.SubscribeErrorCode,
              kinds.MessageKind.TRACK_STATUS_ERROR: d14.SubscribeErrorCode,
              kinds.MessageKind.PUBLISH_ERROR: d14.PublishErrorCode,
              kinds.MessageKind.FETCH_ERROR: d14.FetchErrorCode,
              kinds.MessageKind.PUBLISH_NAMESPACE_ERROR: d14.PublishNamespaceErrorCode,
              kinds.MessageKind.PUBLISH_NAMESPACE_CANCEL: d14.PublishNamespaceErrorCode,
              kinds.MessageKind.SUBSCRIBE_NAMESPACE_ERROR: d14.SubscribeNamespaceErrorCode}
    assert set(DRAFT_14.request_errors) == set(drafts)
    for message, draft in drafts.items():
        table = DRAFT_14.request_errors[message]
        assert {name.name: code for name, code in table.codes.items()} == {m.name: int(m) for m in draft}
        assert DRAFT_14.request_error_code(message, kinds.RequestError.UNAUTHORIZED) == 0x1


def test_draft_16_has_one_request_error_table_for_every_answer() -> None:
    E = kinds.RequestError
    aliases = {"DOES_NOT_EXIST": {E.TRACK_DOES_NOT_EXIST, E.NAMESPACE_PREFIX_UNKNOWN},
               "PREFIX_OVERLAP": {E.NAMESPACE_PREFIX_OVERLAP}}
    table = DRAFT_16.request_errors[kinds.MessageKind.REQUEST_ERROR]
    for code in d16.RequestErrorCode:
        names = aliases.get(code.name, {E[code.name]} if code.name in E.__members__ else set())
        assert names and {n for n, c in table.codes.items() if c == code} == names, code
    assert table.name(0x10) is E.TRACK_DOES_NOT_EXIST  # the name a DOES_NOT_EXIST from the wire reads as
    assert set(DRAFT_16.request_errors) == {kinds.MessageKind.REQUEST_ERROR, *DRAFT_14.request_errors}
    assert all(t is table for t in DRAFT_16.request_errors.values())
    with pytest.raises(Exception, match="NO_OBJECTS"):
        DRAFT_16.request_error_code(kinds.MessageKind.FETCH_ERROR, E.NO_OBJECTS)  # gone since draft-15
    assert DRAFT_16.request_error_code(kinds.MessageKind.FETCH_ERROR, E.INVALID_RANGE) == 0x11


def test_identity_and_a_few_numbers_from_the_text() -> None:
    assert (DRAFT_14.draft, DRAFT_14.version, DRAFT_14.alpn) == (14, 0xFF00000E, "moq-00")
    assert (DRAFT_16.draft, DRAFT_16.version, DRAFT_16.alpn) == (16, 0xFF000010, "moqt-16")
    assert PROFILES == (DRAFT_18, DRAFT_16, DRAFT_14)
    for profile in (DRAFT_16, DRAFT_14):
        assert profile.message_types.code(kinds.MessageKind.SUBSCRIBE) == 0x03
        assert profile.message_types.code(kinds.MessageKind.CLIENT_SETUP) == 0x20
        assert profile.session_errors.code(kinds.SessionError.PROTOCOL_VIOLATION) == 0x3
        assert profile.setup_parameters.code(kinds.SetupParameter.MOQT_IMPLEMENTATION) == 0x07
    assert DRAFT_16.message_types.code(kinds.MessageKind.REQUEST_OK) == 0x07  # draft-14's PUBLISH_NAMESPACE_OK
    assert DRAFT_16.publish_done.code(kinds.PublishDoneStatus.MALFORMED_TRACK) == 0x12  # draft-14: 0x7
    assert DRAFT_14.layout == Layout() and DRAFT_14.shape is SessionShape.DRAFT_14
    assert DRAFT_16.shape is SessionShape.DRAFT_16 and DRAFT_18.shape is SessionShape.DRAFT_18
    assert not DRAFT_14.extension_headers.codes and not DRAFT_14.subscribe_options.codes


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: f"d{p.draft}")
def test_every_message_is_framed_with_the_profiles_type(profile: Profile) -> None:
    classes = message_classes(profile)
    assert sorted(classes) == sorted(profile.message_types.codes.values())
    assert set(classes.values()) == {cls for cls in ALL_MESSAGES if profile.has_message(cls.KIND)}
    sample: ControlMessage = Fetch.standalone_fetch(0, (b"a",), b"t", Location(0, 0), Location(0, 1))
    assert Reader(sample.encode(profile)).pull_varint() == profile.message_types.code(kinds.MessageKind.FETCH)


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: f"d{p.draft}")
def test_every_message_parameter_has_a_scope_and_every_request_message_exists(profile: Profile) -> None:
    assert set(profile.parameter_scope) == set(profile.request_parameters.codes)
    for kinds_of in profile.parameter_scope.values():
        assert all(profile.has_message(kind) for kind in kinds_of)
    assert all(profile.has_message(kind) for kind in profile.request_messages)


def test_the_data_framing_table_is_the_drafts_and_one_to_one() -> None:
    framing = DRAFT_14.data_framing
    assert framing.fetch_header == d14.DataStreamType.FETCH_HEADER
    assert int(d14.DataStreamType.FETCH_HEADER) == 0x05
    assert set(framing.subgroup_types) | {framing.fetch_header} == set(d14.DataStreamType)
    assert set(framing.datagram_types) == set(d14.DatagramType)
    assert len(framing.subgroup_codes) == len(framing.subgroup_types)  # no two types mean the same form
    assert len(framing.datagram_codes) == len(framing.datagram_types)
    assert framing.subgroup_types[0x1B] == SubgroupForm(kinds.SubgroupIdMode.FIRST_OBJECT, True, True)
    assert framing.subgroup_types[0x14] == SubgroupForm(kinds.SubgroupIdMode.PRESENT, False, False)
    assert framing.datagram_types[0x06] == DatagramForm(False, True, False, False)
    assert framing.datagram_types[0x21] == DatagramForm(True, False, True, True)
    assert not framing.fetch_serialization_flags and framing.status_objects_extensions


def _ranges(*spans: tuple[int, int]) -> set[int]:
    return {t for low, high in spans for t in range(low, high + 1)}


def test_the_draft_16_data_framing_is_the_texts() -> None:
    framing = DRAFT_16.data_framing
    assert framing.fetch_header == 0x05 and framing.fetch_serialization_flags
    assert not framing.status_objects_extensions
    # the type ranges of the SUBGROUP_HEADER and OBJECT_DATAGRAM figures
    assert set(framing.subgroup_types) == _ranges((0x10, 0x15), (0x18, 0x1D), (0x30, 0x35), (0x38, 0x3D))
    assert set(framing.datagram_types) == _ranges((0x00, 0x0F), (0x20, 0x21), (0x24, 0x25), (0x28, 0x29),
                                                 (0x2C, 0x2D))
    assert len(framing.subgroup_codes) == len(framing.subgroup_types)
    assert len(framing.datagram_codes) == len(framing.datagram_types)
    assert framing.subgroup_types[0x35] == SubgroupForm(kinds.SubgroupIdMode.PRESENT, True, False, True)
    assert framing.subgroup_types[0x14] == SubgroupForm(kinds.SubgroupIdMode.PRESENT, False, False, False)
    assert framing.datagram_types[0x0C] == DatagramForm(False, False, False, False, True)
    assert framing.datagram_types[0x24] == DatagramForm(False, False, False, True, False)
    # draft-14's code points that draft-16 gave another meaning, or none
    for code, form in DRAFT_14.data_framing.subgroup_types.items():
        assert DRAFT_16.data_framing.subgroup_types[code] == form  # the default-priority bit is new
    assert DRAFT_16.data_framing.datagram_types[0x20] == DRAFT_14.data_framing.datagram_types[0x20]


def _imports_the_draft_14_module(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom) and node.module == "moqt.profiles":
        return any(alias.name == "draft14" for alias in node.names)
    return isinstance(node, ast.Import) and any(alias.name == "moqt.profiles.draft14" for alias in node.names)


def _draft_14_importers() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module in {"moqt", "moqt.profile",
                                                                          "moqt.profiles.draft14"}:
                    names = {alias.name for alias in node.names} & DRAFT_14_ENUMS
                    if node.module != "moqt.profiles.draft14":  # there the value names are the neutral ones
                        names -= {"GroupOrder", "FilterType", "FetchType", "ObjectStatus", "AliasType"}
                    if names:
                        found.setdefault(rel, set()).update(names)
                elif _imports_the_draft_14_module(node):
                    found.setdefault(rel, set()).add("moqt.profiles.draft14")
    return found


def test_no_module_outside_the_profiles_names_draft_14_enums() -> None:
    importers = _draft_14_importers()
    assert not [path for path in importers if path.startswith(CORE)], "the sans-I/O core must read the profile"
    unexpected = set(importers) - ALLOWED
    assert not unexpected, f"users of draft-14 enums: {sorted(unexpected)}; use moqt.kinds and the profile"


def test_the_compatibility_face_is_gone() -> None:
    assert not (ROOT / "moqt" / "profile.py").exists()
    with pytest.raises(ModuleNotFoundError):
        __import__("moqt.profile")


DRAFT_16_ONLY_ENUMS = frozenset({"MessageParameterType", "RequestErrorCode", "ExtensionHeaderType",
                                 "SubscribeOptionsCode"})


def test_no_module_outside_the_draft_16_profile_names_its_enums() -> None:
    users: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.ImportFrom):
                    continue
                imported = {alias.name for alias in node.names}
                if (node.module == "moqt.profiles.draft16" and imported & (DRAFT_14_ENUMS | DRAFT_16_ONLY_ENUMS)) \
                        or (node.module == "moqt.profiles" and "draft16" in imported):
                    users.add(rel)
    assert not [path for path in users if path.startswith(CORE)], "the sans-I/O core must read the profile"
    # a later draft's profile may reuse the tables draft-16 left unchanged (draft18.py: GroupOrder, ...)
    assert users <= {"tests/test_moqt_profile.py", "moqt/profiles/draft18.py"}, sorted(users)
