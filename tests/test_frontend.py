"""The front end's sans-I/O parts: the OpenAI request check, detokenization, and its settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from control.frontend.openai import ApiError, Limits, chunk, parse_completion, sse
from control.frontend.settings import FrontendSettings
from control.frontend.tokenizer import ByteTokenizer, TextStream
from control.up.layout import bytes_model_descriptor
from kvsp.errors import ValidationError
from kvsp.service.config import RoleConfig

LIMITS = Limits("kvsp-test", max_prompt_tokens=64, max_tokens_limit=100)
TOK = ByteTokenizer()


def parse(doc: object) -> object:
    return parse_completion(json.dumps(doc).encode(), LIMITS, TOK)


def refusal(body: bytes | dict[str, object]) -> ApiError:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(ApiError) as info:
        parse_completion(data, LIMITS, TOK)
    return info.value


def test_text_prompt_with_temperature_zero_is_greedy() -> None:
    req = parse_completion(b'{"model": "kvsp-test", "prompt": "h\\u00e9", "max_tokens": 5, "temperature": 0}',
                           LIMITS, TOK)
    assert req.prompt == (104, 0xC3, 0xA9)
    assert (req.method, req.params, req.max_tokens, req.stream) == ("greedy", (), 5, False)


def test_defaults_follow_openai_top_p_sampling_with_seed() -> None:
    req = parse_completion(b'{"model": "kvsp-test", "prompt": [1, 2, 3], "seed": 7, "stream": true, '
                           b'"stream_options": {"include_usage": true}, "top_p": 0.5}', LIMITS, TOK)
    assert req.prompt == (1, 2, 3) and req.max_tokens == 16
    assert (req.method, dict(req.params), req.seed, req.stream, req.include_usage) == \
        ("top-p", {"p": 0.5, "temperature": 1.0}, 7, True, True)


def test_single_prompt_in_a_batch_list_is_accepted() -> None:
    assert parse_completion(b'{"model": "kvsp-test", "prompt": ["ab"]}', LIMITS, TOK).prompt == (97, 98)


@pytest.mark.parametrize(("body", "status", "param"), [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    (b"\xff\xfe", 400, None),
    ({"prompt": "x"}, 400, "model"),
    ({"model": "gpt-4", "prompt": "x"}, 404, "model"),
    ({"model": "kvsp-test"}, 400, "prompt"),
    ({"model": "kvsp-test", "prompt": ""}, 400, "prompt"),
    ({"model": "kvsp-test", "prompt": 5}, 400, "prompt"),
    ({"model": "kvsp-test", "prompt": [1, "a"]}, 400, "prompt"),
    ({"model": "kvsp-test", "prompt": [256]}, 400, "prompt"),
    ({"model": "kvsp-test", "prompt": [-1]}, 400, "prompt"),
    ({"model": "kvsp-test", "prompt": "x" * 65}, 413, "prompt"),
    ({"model": "kvsp-test", "prompt": list(range(65))}, 413, "prompt"),
    ({"model": "kvsp-test", "prompt": "x" * 10_000}, 413, "prompt"),
    ({"model": "kvsp-test", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": "kvsp-test", "prompt": "x", "max_tokens": 101}, 400, "max_tokens"),
    ({"model": "kvsp-test", "prompt": "x", "max_tokens": 1.5}, 400, "max_tokens"),
    ({"model": "kvsp-test", "prompt": "x", "max_tokens": True}, 400, "max_tokens"),
    ({"model": "kvsp-test", "prompt": "x", "temperature": -1}, 400, "temperature"),
    ({"model": "kvsp-test", "prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ({"model": "kvsp-test", "prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"model": "kvsp-test", "prompt": "x", "stream": "yes"}, 400, "stream"),
    ({"model": "kvsp-test", "prompt": "x", "n": 2}, 400, "n"),
    ({"model": "kvsp-test", "prompt": "x", "logprobs": 3}, 400, "logprobs"),
    ({"model": "kvsp-test", "prompt": "x", "stop": ["\n"]}, 400, "stop"),
    ({"model": "kvsp-test", "prompt": "x", "mystery": 1}, 400, "mystery"),
    ({"model": "kvsp-test", "prompt": "x", "user": 5}, 400, "user"),
    ({"model": "kvsp-test", "prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
])
def test_bad_requests_are_refused_with_the_member_named(body: bytes | dict[str, object], status: int,
                                                        param: str | None) -> None:
    error = refusal(body)
    assert error.status == status
    assert error.param == param
    doc = json.loads(error.to_bytes())
    assert doc["status"] == status and doc["title"] and doc["detail"]  # RFC 9457
    assert doc["error"]["message"] == doc["detail"] and doc["error"]["param"] == param  # OpenAI's shape


def test_text_stream_never_splits_a_character_and_concatenates_to_the_full_decoding() -> None:
    text = "a€b😀c"
    tokens = TOK.encode(text)
    stream = TextStream(TOK)
    pieces = [stream.push(t) for t in tokens]
    assert "".join(pieces) + stream.flush() == text
    assert all("\ufffd" not in p for p in pieces)
    assert pieces[1:4] == ["", "", "€"]  # held back until the 3-octet character is complete


def test_text_stream_flushes_an_incomplete_character_as_a_replacement() -> None:
    stream = TextStream(TOK)
    assert stream.push(0xE2) == ""
    assert stream.flush() == "\ufffd"


def test_sse_events_and_chunks_have_the_openai_shape() -> None:
    event = sse(chunk("s1", "m", 5, "hé", kvsp={"index": 0, "epoch": 1, "token": 9}))
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    doc = json.loads(event[6:])
    assert doc["object"] == "text_completion" and doc["id"] == "cmpl-s1"
    assert doc["choices"] == [{"text": "hé", "index": 0, "logprobs": None, "finish_reason": None}]
    assert doc["kvsp"] == {"index": 0, "epoch": 1, "token": 9}
    assert sse("[DONE]") == b"data: [DONE]\n\n"


# -- settings ---------------------------------------------------------------------------------------------
def config(tmp_path: Path, **frontend: object) -> RoleConfig:
    (tmp_path / "model.json").write_text(json.dumps(bytes_model_descriptor().to_json()))
    section: dict[str, object] = {"pc": "https://127.0.0.1:1/pc/", "descriptor": "model.json",
                                  "tenants": {"public": "00" * 16}, **frontend}
    return RoleConfig.from_mapping({"roles": ["frontend"], "server": {"base_uri": "https://127.0.0.1:2/fe/"},
                                    "frontend": section}, tmp_path)


def test_settings_read_tenants_keys_and_defaults(tmp_path: Path) -> None:
    (tmp_path / "acme.key").write_text("sk-0123456789abcdef\n")
    s = FrontendSettings.from_config(config(tmp_path, tenants={"public": "00" * 16, "acme": "11" * 16},
                                            api_keys={"acme": "acme.key"}, anonymous_tenant="public",
                                            listen="127.0.0.1:9999"))
    assert (s.host, s.port, s.model, s.tokenizer) == ("127.0.0.1", 9999, "kvsp-test", "bytes")
    assert s.tenants["acme"] == bytes([0x11] * 16)
    assert s.tenant_of_key(b"sk-0123456789abcdef") == "acme"
    assert s.tenant_of_key(b"sk-0123456789abcdeX") is None
    assert s.descriptor.compat_id == bytes_model_descriptor().compat_id


@pytest.mark.parametrize(("extra", "member"), [
    ({"colour": "blue"}, "frontend.colour"),
    ({"tenants": {}}, "frontend.tenants"),
    ({"tenants": {"t": "zz"}}, "frontend.tenants.t"),
    ({"anonymous_tenant": "nobody"}, "frontend.anonymous_tenant"),
    ({"api_keys": {"nobody": "k"}}, "frontend.api_keys.nobody"),
    ({"api_keys": {"public": "missing.key"}}, "frontend.api_keys.public"),
    ({"listen": "nowhere"}, "frontend.listen"),
    ({"max_concurrent": 0}, "frontend.max_concurrent"),
    ({"tokenizer": "no-such-tokenizer.json"}, "frontend.tokenizer"),
    ({"descriptor": "absent.json"}, "frontend.descriptor"),
])
def test_bad_settings_name_the_member(tmp_path: Path, extra: dict[str, object], member: str) -> None:
    with pytest.raises(ValidationError) as info:
        FrontendSettings.from_config(config(tmp_path, **extra))
    assert member in str(info.value)


def test_a_short_api_key_is_refused_without_echoing_it(tmp_path: Path) -> None:
    (tmp_path / "weak.key").write_text("hunter2")
    with pytest.raises(ValidationError) as info:
        FrontendSettings.from_config(config(tmp_path, api_keys={"public": "weak.key"}))
    assert "hunter2" not in str(info.value)
