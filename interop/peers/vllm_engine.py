"""A vLLM engine driven by interop.vllm.VllmEngine, run by the .venv-vllm interpreter: JSON lines on stdio.

    python vllm_engine.py MODEL_DIR CONFIG.toml|none [--max-model-len N] [--max-num-seqs N]
                          [--max-num-batched-tokens N]
    -> {"ready": true}  |  {"error": "..."} and exit status 3 when vLLM (or the connector) refuses to start
    <- {"op": "generate", "prompts": [[ids]], "max_tokens": 8, "cache_salt": null, "params": null, "logprobs": 0}
    -> {"outputs": [{"tokens": [...], "logprobs": [[[id, lp], ...], ...], "kv": {...}}], "stats": {...},
        "elapsed_s": 0.123}
    <- {"op": "drain"}  -> {"stats": {...}}     (waits for the connector's stores in flight)
    <- {"op": "quit"}

vLLM runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so the connector's counters are read here.
``elapsed_s`` is the wall time of the ``llm.generate`` call alone (with ``max_tokens`` 1: the prefill and
the first token, the TTFT benchmarks/bench_vllm.py reports), measured here so that neither the pipes nor
the JSON count.  The options size vLLM (defaults: 1024, 4 and vLLM's own); every other setting is fixed.
The JSON lines go out on a private copy of fd 1; fd 1 itself is pointed at stderr (the log), because vLLM's
logger and its C++ code write to stdout, and log lines interleaved with the answers made the test's reader
wait for an answer that already sat in its buffer (the start-up "stall" of issue 15).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


_ANSWERS = os.fdopen(os.dup(1), "w", buffering=1)  # the JSON channel; fd 1 becomes the log
sys.stdout.flush()
os.dup2(2, 1)


def say(obj: dict[str, Any]) -> None:
    _ANSWERS.write(json.dumps(obj) + "\n")
    _ANSWERS.flush()


def stats() -> dict[str, int]:
    from kvsp.vllm.runtime import process_runtimes  # noqa: PLC0415 - only once vLLM has loaded the connector

    out: dict[str, int] = {}
    for runtime in process_runtimes():
        for k, v in runtime.stats.as_dict().items():
            out[k] = out.get(k, 0) + v
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vllm_engine.py")
    parser.add_argument("model")
    parser.add_argument("config")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    return parser.parse_args(argv)


def main() -> int:
    args = parse_args(sys.argv[1:])
    model, config = args.model, args.config
    from vllm import LLM, SamplingParams  # noqa: PLC0415 - after the __main__ guard: vLLM spawns
    from vllm.config import KVTransferConfig  # noqa: PLC0415 - as above

    kw: dict[str, Any] = {}
    if args.max_num_batched_tokens is not None:
        kw["max_num_batched_tokens"] = args.max_num_batched_tokens
    if config != "none":
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="KvspConnector", kv_connector_module_path="kvsp.vllm", kv_role="kv_both",
            kv_load_failure_policy="recompute", kv_connector_extra_config={"kvsp_config": config})
    try:
        llm = LLM(model=model, dtype="float32", block_size=32, enforce_eager=True, max_model_len=args.max_model_len,
                  gpu_memory_utilization=float(os.environ.get("KVSP_VLLM_MEMORY", "0.1")),
                  enable_prefix_caching=False, max_num_seqs=args.max_num_seqs, **kw)
    except Exception as exc:
        say({"error": f"{type(exc).__name__}: {exc}"})
        return 3
    say({"ready": True})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        if cmd["op"] == "drain":
            from kvsp.vllm.runtime import process_runtimes  # noqa: PLC0415 - only once vLLM has loaded the connector

            for runtime in process_runtimes():
                runtime.drain(timeout=30.0)
            say({"stats": stats()})
            continue
        extra = {"kv_transfer_params": cmd["params"]} if cmd.get("params") else None
        sp = SamplingParams(temperature=0.0, max_tokens=cmd["max_tokens"], logprobs=cmd.get("logprobs") or None,
                            extra_args=extra)
        prompts: list[Any] = []
        for ids in cmd["prompts"]:
            p: dict[str, Any] = {"prompt_token_ids": ids}
            if cmd.get("cache_salt"):
                p["cache_salt"] = cmd["cache_salt"]
            prompts.append(p)
        started = time.perf_counter()
        results = llm.generate(prompts, sp, use_tqdm=False)
        elapsed = time.perf_counter() - started
        outputs = []
        for r in results:
            o = r.outputs[0]
            lps = [[[int(t), float(v.logprob)] for t, v in step.items()] for step in (o.logprobs or [])]
            outputs.append({"tokens": list(o.token_ids), "logprobs": lps, "kv": r.kv_transfer_params})
        say({"outputs": outputs, "stats": stats(), "elapsed_s": elapsed})
    return 0


if __name__ == "__main__":
    sys.exit(main())
