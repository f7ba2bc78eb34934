"""The workload (sans-I/O), the report's figures and the metrics bookkeeping of kvsp up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from control.frontend.settings import FrontendSettings
from control.frontend.tokenizer import ByteTokenizer
from control.holder.settings import HolderSettings
from control.instance.settings import InstanceSettings
from control.pc.settings import PcSettings
from control.up import report
from control.up.layout import BASELINE_SUFFIX, Deployment, UpOptions, prepare
from control.up.main import checks
from control.up.runner import KillRecord, RequestResult, RunResult
from control.up.scrape import Scraper, by_label, labelled, parse_exposition, total
from control.up.workload import Conversation, WorkloadSpec, build, percentile
from kvsp.service.config import RoleConfig
from relay.settings import RelaySettings

ENCODE = ByteTokenizer().encode


def test_the_workload_is_a_function_of_its_spec() -> None:
    spec = WorkloadSpec(chats=8, seed=3)
    assert build(spec) == build(spec)
    assert build(spec) != build(WorkloadSpec(chats=8, seed=4))


def test_chats_share_system_prompts_and_documents_and_alternate_tenants() -> None:
    chats = build(WorkloadSpec(chats=12, system_prompts=2, documents=3, rag_fraction=1.0)).chats
    assert len({c.system for c in chats}) == 2
    assert len({c.document for c in chats}) <= 3 and all(c.document for c in chats)
    assert [c.tenant for c in chats[:4]] == ["public", "acme", "public", "acme"]
    # the same system prompt reaches both tenants: scopes keep their caches apart
    assert {c.tenant for c in chats if c.system == chats[0].system} == {"public"}
    assert {c.tenant for c in chats if c.system == chats[1].system} == {"acme"}


def test_a_conversation_extends_the_exact_token_history() -> None:
    chat = build(WorkloadSpec(chats=1, turns=2, rag_fraction=1.0)).chats[0]
    conv = Conversation(chat, ENCODE)
    first = conv.next_prompt()
    assert first == ENCODE(chat.system) + ENCODE(chat.document or "") + ENCODE(chat.questions[0])
    conv.answered(first, [200, 201], ENCODE("\n"))
    second = conv.next_prompt()
    assert second[:len(first) + 3] == [*first, 200, 201, 10]  # turn 1 extends turn 0 and its answer
    assert conv.request_id == "chat-000/turn-1" and not conv.done
    conv.answered(second, [7], [])
    assert conv.done


def test_percentile_interpolates() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0], 0.95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([4.0, 1.0, 3.0, 2.0], 1.0) == 4.0


# -- metrics -------------------------------------------------------------------------------------------------
EXPOSITION = """# HELP kvsp_instance_tokens_fetched_total x
# TYPE kvsp_instance_tokens_fetched_total counter
kvsp_instance_tokens_fetched_total{source="local"} 32.0
kvsp_instance_tokens_fetched_total{source="remote"} 16.0
kvsp_instance_tokens_recomputed_total 8.0
garbage line
"""


def test_exposition_parsing_and_sums() -> None:
    samples = parse_exposition(EXPOSITION)
    assert total(samples, "kvsp_instance_tokens_fetched_total") == 48.0
    assert labelled(samples, "kvsp_instance_tokens_fetched_total", "source", "remote") == 16.0
    assert total(samples, "kvsp_instance_tokens_recomputed_total") == 8.0
    assert "garbage" not in json.dumps(samples)


def test_totals_add_the_last_scrape_of_each_incarnation() -> None:
    scraper = Scraper({}, None, lambda name: 0)  # type: ignore[arg-type]
    scraper.latest[("ii1", 1)] = {"kvsp_instance_tokens_recomputed_total": 100.0}
    scraper.latest[("ii1", 2)] = {"kvsp_instance_tokens_recomputed_total": 5.0}  # counters restart at 0
    scraper.latest[("ii2", 1)] = {"kvsp_instance_tokens_recomputed_total": 7.0}
    assert scraper.totals() == {"ii1": {"kvsp_instance_tokens_recomputed_total": 105.0},
                                "ii2": {"kvsp_instance_tokens_recomputed_total": 7.0}}


# -- the report ------------------------------------------------------------------------------------------------
def result(rid: str, tokens: list[int], *, moves: int = 0, ttft: float = 0.1) -> RequestResult:
    return RequestResult(rid, rid.partition("/")[0], 0, "public", 10, status=200, ttft_s=ttft, total_s=0.5,
                         tokens=tokens, moves=moves, resume_ms=[1500.0] if moves else [], finish_reason="length")


METRICS = {"pc": {"kvsp_is_lookup_keys_requested_total": 10.0, "kvsp_is_lookup_keys_matched_total": 4.0,
                  "kvsp_pc_migrations_total": 1.0},
           "ii1": parse_exposition(EXPOSITION),
           "h1": {'kvsp_holder_lease_rejections_total{reason="ttl"}': 2.0, "kvsp_holder_bytes_served_total": 4096.0},
           "relay1": {"kvsp_relay_cache_hits_total": 3.0, "kvsp_relay_bytes_out_total": 100.0}}


def test_figures_from_results_and_metrics() -> None:
    spec = WorkloadSpec(chats=1, turns=3)
    main = RunResult("main", 2.0, [result("c/0", [1, 2]), result("c/1", [3, 4], moves=1, ttft=2.0),
                                   result("c/2", [5, 6], ttft=0.3)], KillRecord("ii1", "https://x/ii1/", 0.5, ["c/1"]))
    baseline = RunResult("baseline", 2.0, [result("c/0", [1, 2], ttft=0.4), result("c/1", [3, 4], ttft=0.4),
                                           result("c/2", [5, 9], ttft=0.4)])
    fig = report.build(spec, main, baseline, METRICS, {"relay1": {}})
    assert fig["lookup"] == {"keys_requested": 10.0, "keys_matched": 4.0, "hit_ratio": 0.4}
    assert fig["tokens"] == {"fetched_local": 32.0, "fetched_remote": 16.0, "recomputed": 8.0,
                             "fetched_ratio": round(48 / 56, 4)}
    assert fig["lease_rejections"] == 2.0
    assert fig["bytes"] == {"holder_octets": 4096.0, "holder_https_octets": 0.0, "holder_moqt_octets": 0.0,
                            "http_blocks": 0, "moqt_blocks": 0, "moqt_octets": None, "relay_octets_out": 100.0}
    assert fig["relay"] == {"running": True, "cache_hits": 3.0}
    assert fig["outputs_vs_baseline"] == {"compared": 3, "identical": 2, "differing": ["c/2"]}
    assert fig["kill"]["completed"] == 1 and fig["kill"]["identical_to_baseline"] == 1  # type: ignore[index]
    assert fig["ttft"]["with_cache"]["requests"] == 2  # type: ignore[index]  # the moved request is apart
    assert fig["ttft"]["with_cache_all"]["requests"] == 3  # type: ignore[index]
    assert fig["migrations"]["requests_moved"] == 1  # type: ignore[index]
    verdict = checks(fig, kill_planned=True)
    assert verdict["every request completed"] and verdict["lookup hit ratio > 0"]
    assert verdict["greedy outputs identical to the no-failure baseline"] is False
    table = report.table(fig)
    assert "lookup hit ratio (keys)" in table and "2/3" in table


def test_holder_octets_are_split_by_transport() -> None:
    exposition = """# TYPE kvsp_holder_bytes_served_total counter
kvsp_holder_bytes_served_total{transport="https"} 3000.0
kvsp_holder_bytes_served_total{transport="moqt"} 500.0
kvsp_holder_blocks_served_total{part="full"} 2.0
kvsp_holder_blocks_served_total{part="moqt-full"} 1.0
"""
    h2 = parse_exposition(exposition)
    assert by_label(h2, "kvsp_holder_bytes_served_total", "transport") == {"https": 3000.0, "moqt": 500.0}
    metrics = {"h1": {'kvsp_holder_bytes_served_total{transport="moqt"}': 20.0}, "h2": h2}
    fig = report.build(WorkloadSpec(chats=1, turns=1), RunResult("main", 1.0, [result("c/0", [1])]), None,
                       metrics, {})
    assert fig["bytes"] == {"holder_octets": 3520.0, "holder_https_octets": 3000.0, "holder_moqt_octets": 520.0,
                            "http_blocks": 2.0, "moqt_blocks": 1.0, "moqt_octets": None, "relay_octets_out": None}
    row = next(line for line in report.table(fig).splitlines() if line.startswith("octets over HTTPS / MOQT"))
    assert row.endswith("3,000 / 520")


def test_checks_fail_without_the_planned_kill_and_on_failed_requests() -> None:
    failed = result("c/0", [])
    failed.status, failed.error = 502, "boom"
    main = RunResult("main", 1.0, [failed])
    fig = report.build(WorkloadSpec(chats=1, turns=1), main, None, {}, {})
    verdict = checks(fig, kill_planned=True)
    assert verdict == {"every request completed": False, "lookup hit ratio > 0": False,
                       "tokens in index order, none repeated": True, "an instance was killed mid-stream": False}
    assert fig["requests"]["errors"] == ["c/0: 502 boom"]  # type: ignore[index]


def test_report_files_and_plots(tmp_path: Path) -> None:
    main = RunResult("main", 1.0, [result("c/0", [1]), result("c/1", [2], moves=1)],
                     KillRecord("ii1", "u", 0.2, ["c/1"]))
    fig = report.build(WorkloadSpec(chats=1, turns=2), main, main, METRICS, {})
    written = report.write(tmp_path, fig, main, main)
    assert {p.name for p in written} == {"report.json", "requests.json", "ttft_cdf.png", "tokens.png", "timeline.png"}
    assert json.loads((tmp_path / "report.json").read_text())["lookup"]["hit_ratio"] == 0.4
    assert (tmp_path / "timeline.png").read_bytes().startswith(b"\x89PNG")


# -- the run directory -------------------------------------------------------------------------------------------
def test_prepare_writes_configs_every_role_accepts(tmp_path: Path) -> None:
    deployment = prepare(tmp_path, UpOptions(model="test", relay=False))
    assert Deployment.load(tmp_path) == deployment
    main = {p.name for p in deployment.phases["main"]}
    assert main == {"pc", "h1", "ii1", "ii2", "fe"}
    assert {p.name for p in deployment.phases["baseline"]} == {n + BASELINE_SUFFIX for n in ("pc", "ii1", "ii2", "fe")}
    readers = {"pc": PcSettings.from_config, "holder": HolderSettings.from_config,
               "instance": InstanceSettings.from_config, "frontend": FrontendSettings.from_config}
    for phase, procs in deployment.phases.items():
        for proc in procs:
            config = RoleConfig.load(tmp_path / proc.config)
            assert config.server.base_uri == proc.uri and config.tls is not None
            for role in proc.roles.split(","):
                if role in readers:
                    readers[role](config)
            if phase == "baseline" and proc.instance:
                assert config.roles == ("instance",) and config.section("instance")["memory_blocks_octets"] == 0
    assert (tmp_path / "acme.apikey").stat().st_mode & 0o077 == 0  # secrets are private
    assert (tmp_path / "public.scope.key").stat().st_mode & 0o077 == 0


def test_a_relay_is_configured_when_asked(tmp_path: Path) -> None:
    deployment = prepare(tmp_path, UpOptions(model="test", relay=True, moqt_fetch=True))
    relay = next(p for p in deployment.phases["main"] if p.name == "relay1")
    settings = RelaySettings.from_config(RoleConfig.load(tmp_path / relay.config))
    assert settings.uri.startswith("moqt://127.0.0.1:")
    # D4: the cache holder publishes through its rack relay and the instances read moqt replicas through it
    names = [p.name for p in deployment.phases["main"]]
    assert names.index("relay1") < names.index("h1")
    h1 = HolderSettings.from_config(RoleConfig.load(tmp_path / next(p for p in deployment.phases["main"]
                                                                    if p.name == "h1").config))
    assert h1.moqt is not None and h1.moqt.relay == settings.uri
    for proc in deployment.phases["main"]:
        if proc.instance:
            instance = InstanceSettings.from_config(RoleConfig.load(tmp_path / proc.config))
            assert instance.moqt_fetch and instance.moqt_relay == settings.uri


def test_bad_command_lines_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from control.cli import main  # noqa: PLC0415

    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    cases = [(["up", "--run-dir", str(tmp_path / "a"), "--chats", "0"], "--chats must be at least 1"),
             (["up", "--run-dir", str(tmp_path / "b"), "--kill-after", "1.5"], "--kill-after"),
             (["up", "--run-dir", str(tmp_path / "used")], "not empty"),
             (["workload", "--run-dir", str(tmp_path / "none")], "deployment.json")]
    for argv, message in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
