"""The draft-14 profile: every code point loads through it, and nothing else names draft-14 numbers.

The numbers themselves are proven by the wire vectors (test_moqt_messages, test_moqt_data, the
aiomoqt vectors); here the profile's tables are checked to be complete, one-to-one and equal to the
draft's tables, and an AST scan keeps draft-14's enums inside ``moqt.profiles.draft14``.
"""

from __future__ import annotations

import ast
import enum
from enum import IntEnum
from pathlib import Path

import pytest

from moqt import kinds
from moqt.messages import ALL_MESSAGES, ControlMessage, Fetch, message_classes
from moqt.profiles import DRAFT_14
from moqt.profiles import draft14 as d14
from moqt.profiles.base import CodeMap, DatagramForm, SubgroupForm
from moqt.wire import Location, Reader

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("moqt", "kvsp", "relay", "control", "interop", "benchmarks", "tests")
DRAFT_14_ENUMS = frozenset({
    "MessageType", "SetupParameterType", "VersionParameterType", "SessionErrorCode", "SubscribeErrorCode",
    "PublishDoneCode", "PublishErrorCode", "FetchErrorCode", "PublishNamespaceErrorCode",
    "SubscribeNamespaceErrorCode", "StreamResetCode", "DataStreamType", "DatagramType", "GroupOrder", "FilterType",
    "FetchType", "ObjectStatus", "AliasType"})
#: Where draft-14 numbers may be named: the profile itself and the tests that check its tables
#: against the draft's (the data-stream vectors of test_moqt_data are written in draft-14 types).
ALLOWED = frozenset({"moqt/profiles/draft14.py", "tests/test_moqt_data.py", "tests/test_moqt_profile.py"})
#: The sans-I/O core: it reads every number from the profile it was given.
CORE = ("moqt/session/", "moqt/messages/", "moqt/params.py", "moqt/wire.py", "moqt/events.py", "moqt/kinds.py",
        "moqt/errors.py", "moqt/testing.py")

TABLES: list[tuple[str, CodeMap[enum.Enum], type[enum.Enum], type[IntEnum]]] = [
    ("message types", DRAFT_14.message_types, kinds.MessageKind, d14.MessageType),  # type: ignore[list-item]
    ("session errors", DRAFT_14.session_errors, kinds.SessionError, d14.SessionErrorCode),  # type: ignore[list-item]
    ("PUBLISH_DONE", DRAFT_14.publish_done, kinds.PublishDoneStatus, d14.PublishDoneCode),  # type: ignore[list-item]
    ("stream resets", DRAFT_14.stream_resets, kinds.StreamReset, d14.StreamResetCode),  # type: ignore[list-item]
    ("group orders", DRAFT_14.group_orders, kinds.GroupOrder, d14.GroupOrder),  # type: ignore[list-item]
    ("filter types", DRAFT_14.filter_types, kinds.FilterType, d14.FilterType),  # type: ignore[list-item]
    ("fetch types", DRAFT_14.fetch_types, kinds.FetchType, d14.FetchType),  # type: ignore[list-item]
    ("object statuses", DRAFT_14.object_statuses, kinds.ObjectStatus, d14.ObjectStatus),  # type: ignore[list-item]
    ("alias types", DRAFT_14.alias_types, kinds.AliasType, d14.AliasType),  # type: ignore[list-item]
    ("setup parameters", DRAFT_14.setup_parameters, kinds.SetupParameter,  # type: ignore[list-item]
     d14.SetupParameterType),
    ("request parameters", DRAFT_14.request_parameters, kinds.RequestParameter,  # type: ignore[list-item]
     d14.VersionParameterType),
]


@pytest.mark.parametrize(("what", "table", "names", "draft"), TABLES, ids=[t[0] for t in TABLES])
def test_every_name_has_its_draft_14_code_point_both_ways(what: str, table: CodeMap[enum.Enum],
                                                          names: type[enum.Enum], draft: type[IntEnum]) -> None:
    assert set(table.codes) == set(names), f"{what}: a name without a draft-14 code point"
    assert {name.name: code for name, code in table.codes.items()} == {m.name: int(m) for m in draft}
    for name in names:
        assert table.name(table.code(name)) is name
    assert table.name(max(table.names) + 1) is None
    assert table.code(0x77) == 0x77  # a wire integer passes through unchanged


def test_request_error_tables_are_the_drafts() -> None:
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


def test_draft_14_identity_and_a_few_numbers_from_the_text() -> None:
    assert (DRAFT_14.draft, DRAFT_14.version, DRAFT_14.alpn) == (14, 0xFF00000E, "moq-00")
    assert DRAFT_14.message_types.code(kinds.MessageKind.SUBSCRIBE) == 0x03
    assert DRAFT_14.message_types.code(kinds.MessageKind.CLIENT_SETUP) == 0x20
    assert DRAFT_14.session_errors.code(kinds.SessionError.PROTOCOL_VIOLATION) == 0x3
    assert DRAFT_14.setup_parameters.code(kinds.SetupParameter.MOQT_IMPLEMENTATION) == 0x07


def test_every_message_is_framed_with_the_profiles_type() -> None:
    classes = message_classes(DRAFT_14)
    assert sorted(classes) == sorted(DRAFT_14.message_types.codes.values())
    assert set(classes.values()) == set(ALL_MESSAGES)
    sample: ControlMessage = Fetch.standalone_fetch(0, (b"a",), b"t", Location(0, 0), Location(0, 1))
    assert Reader(sample.encode(DRAFT_14)).pull_varint() == DRAFT_14.message_types.code(kinds.MessageKind.FETCH)


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


def test_no_module_outside_the_draft_14_profile_names_its_enums() -> None:
    importers = _draft_14_importers()
    assert not [path for path in importers if path.startswith(CORE)], "the sans-I/O core must read the profile"
    unexpected = set(importers) - ALLOWED
    assert not unexpected, f"users of draft-14 enums: {sorted(unexpected)}; use moqt.kinds and the profile"


def test_the_compatibility_face_is_gone() -> None:
    assert not (ROOT / "moqt" / "profile.py").exists()
    with pytest.raises(ModuleNotFoundError):
        __import__("moqt.profile")
