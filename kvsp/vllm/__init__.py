"""kvsp inside vLLM: `KvspConnector`, a KV connector that shares verified blocks across engines (D8).

Load it with ``KVTransferConfig(kv_connector="KvspConnector", kv_connector_module_path="kvsp.vllm",
kv_role="kv_both", kv_connector_extra_config={"kvsp_config": "PATH.toml"})``; docs/vllm.md.

Importing this package imports no vLLM: `KvspConnector` (in `kvsp.vllm.connector`, which needs vLLM) is
loaded on first access, so `kvsp.vllm.config` and `kvsp.vllm.plan` work in any kvsp environment.
"""

from __future__ import annotations

from typing import Any

__all__ = ["KvspConnector"]


def __getattr__(name: str) -> Any:
    if name == "KvspConnector":
        from kvsp.vllm.connector import KvspConnector  # noqa: PLC0415 - vLLM only when vLLM asks

        return KvspConnector
    raise AttributeError(f"module 'kvsp.vllm' has no attribute {name!r}")
