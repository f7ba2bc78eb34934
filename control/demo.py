"""``kvsp demo``: a walkthrough of the protocol core on embedded defaults.

Each step uses the public API exactly as a role does, and checks what it shows, so the walkthrough
fails loudly if the core is broken.  The whole-system deployment (``kvsp up``) replaces it as the
main job once the network roles land.
"""

from __future__ import annotations

import asyncio
import hashlib
import tempfile
from pathlib import Path

import numpy as np

from control.deploy.configs import HolderSection, PolicyFile, RoleFile, ScopeEntry, Tls
from control.deploy.pki import loopback_uri
from kvsp.container import decode_container, encode_container, replica_digest, verify_layers
from kvsp.descriptor import CompatDescriptor
from kvsp.identifiers import role_id
from kvsp.keys import BlockKeyChain, ScopeKey
from kvsp.pki import RoleSpec, make_dev_pki
from kvsp.placement import choose_instance, estimate
from kvsp.records import InstanceStatus, LookupRequest, ReplicaRecord, Residency
from kvsp.registry import Codec, InstanceState, Tier

HOLDER = "https://127.0.0.1:9443/holder/"


def _say(step: int, text: str) -> None:
    print(f"\n[{step}] {text}")


def demo_descriptor() -> CompatDescriptor:
    digest = hashlib.sha256
    return CompatDescriptor(
        model="kvsp-demo-llama", model_digest=digest(b"demo weights").digest(),
        tokenizer_digest=digest(b"demo tokenizer").digest(), layers=4, kv_heads=2, head_dim=64,
        kv_dtype="fp16", positional="rope;theta=10000", block_tokens=16)


def make_block(descriptor: CompatDescriptor, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per-layer K and V tensors [tokens, kv_heads, head_dim], little-endian fp16 (kvsp-layout-1)."""
    rng = np.random.default_rng(seed)
    shape = (descriptor.block_tokens, descriptor.kv_heads, descriptor.head_dim)
    return [(rng.standard_normal(shape).astype("<f2"), rng.standard_normal(shape).astype("<f2"))
            for _ in range(descriptor.layers)]


def run(workdir: Path) -> None:
    d = demo_descriptor()
    _say(1, "Compatibility Descriptor (section 4.1)")
    print(d.canonical().decode())
    print(f"compat_id = {d.compat_id_hex}")

    _say(2, "Scope and Block Keys (section 4.2): the prompt is 40 tokens, B = 16")
    scope = ScopeKey.generate()
    print(f"scope = {scope!r}  (the key itself is never printed)")
    chain = BlockKeyChain(scope, d.compat_id, d.block_tokens)
    keys = chain.extend(range(1000, 1040))
    print(f"{len(keys)} complete blocks, {len(chain.pending_tokens)} tokens wait for the next block:")
    for i, k in enumerate(keys):
        print(f"  K[{i}] = {k.hex()}")
    keys += chain.extend(range(1040, 1048))
    print(f"8 more tokens complete block 2 without rehashing the prefix: K[2] = {keys[2].hex()}")

    _say(3, "KV Block Container (section 4.3) for block 0")
    body = encode_container(Codec.RAW, 0, d.block_tokens, make_block(d, seed=0))
    container = decode_container(body, geometry=d.geometry())
    digests = container.layer_digests()
    print(f"{len(body)} octets, {container.layer_count} layers, header {container.header_length} octets")
    part = decode_container(b"".join(container.slice(2, 3)), geometry=d.geometry())
    verify_layers(part, digests[2:4], first_layer=2)
    print(f"layers 2-3 sliced out without copying and verified against the layer digests: {len(part.data)} octets")

    _say(4, "Replica Record (section 4.4): layers 0-1 in host memory, 2-3 on local storage")
    record = ReplicaRecord(
        block_key=keys[0], compat_id=d.compat_id, scope_id=scope.scope_id, holder=HOLDER, codec=Codec.RAW,
        size=len(body), digest=replica_digest(digests), layer_digests=tuple(digests), ttl_ms=120_000,
        residency=(Residency(Tier.HOST, (0, 1)), Residency(Tier.LOCAL_STORAGE, (2, 3), read_mbit_per_s=8000.0)))
    print(record.to_bytes().decode()[:300] + " ...")
    print(f"holder-id = {role_id(HOLDER)}")

    _section_placement(record, d)

    _say(6, f"Development PKI (decision D1) in {workdir}")
    uris = {"is": loopback_uri("is"), "holder": loopback_uri("holder"), "engine": "https://engine.local/"}
    for issued in make_dev_pki(workdir, [RoleSpec(name, uri) for name, uri in uris.items()]):
        print(f"  {issued.name:<7} {issued.uri:<40} {issued.cert_path.name}")

    _say(7, "Index Service and holder on loopback, mutual TLS 1.3: store, look up, fetch and verify")
    blocks = [encode_container(Codec.RAW, 0, d.block_tokens, make_block(d, seed=i)) for i in range(3)]
    asyncio.run(_storage_round_trip(workdir, uris, d, scope, keys=keys, blocks=blocks))
    print("\nDone. Each role runs on its own with: kvsp serve ROLE --config FILE (see docs/).")


async def _storage_round_trip(workdir: Path, uris: dict[str, str], d: CompatDescriptor, scope: ScopeKey, *,
                              keys: list[bytes], blocks: list[bytes]) -> None:
    from control.serve import serving  # noqa: PLC0415
    from kvsp.client.fetch import BlockFetcher  # noqa: PLC0415
    from kvsp.client.holder import HolderClient  # noqa: PLC0415
    from kvsp.client.http import KvspSession  # noqa: PLC0415
    from kvsp.service.config import RoleConfig  # noqa: PLC0415 - the network roles load only for this step
    from kvsp.service.tls import TlsFiles, client_context  # noqa: PLC0415

    (workdir / "descriptor.json").write_bytes(d.canonical())
    engine = [uris["engine"]]
    PolicyFile(scopes=[ScopeEntry(scope.scope_id.hex(), engine, engine, [*engine, uris["holder"]])]).write(
        workdir / "policy.toml")
    configs = {}
    holder = HolderSection(index=uris["is"], descriptors=["descriptor.json"])
    for role, sections in (("is", ()), ("holder", (holder,))):
        role_file = RoleFile([role], uris[role], Tls.of(role), "policy.toml", sections=sections)
        configs[role] = RoleConfig.load(role_file.write(workdir / f"{role}.toml"))
    print(f"  configs written: {', '.join(sorted(p.name for p in workdir.glob('*.toml')))}")
    async with serving(configs["is"]), serving(configs["holder"]):
        tls = TlsFiles(workdir / "engine.pem", workdir / "engine.key", workdir / "ca.pem")
        async with KvspSession(client_context(tls)) as session:
            for key, body in zip(keys, blocks, strict=True):
                await HolderClient(session).put_block(uris["holder"], d.compat_id, scope.scope_id, key, body)
            print(f"  stored {len(blocks)} blocks at the holder; it publishes their Replica Records to the IS")
            fetcher = BlockFetcher(session, uris["is"])
            for _ in range(100):  # publication is asynchronous
                if (await fetcher.index.lookup(_lookup(d, scope, keys))).matched == len(keys):
                    break
                await asyncio.sleep(0.05)
            prompt = [*keys, hashlib.sha256(b"a fourth block nobody stored").digest()]
            result = await fetcher.fetch(scope.scope_id, d.compat_id, prompt, block_tokens=d.block_tokens)
    print(f"  a {len(prompt) * d.block_tokens}-token prompt: {result.matched} of {len(prompt)} blocks matched, "
          f"{result.loaded_blocks} loaded and verified (Repr-Digest, layer and replica digests)")
    print(f"  the engine recomputes from token {result.recompute_from_token}; "
          f"stats: {fetcher.stats.fetched_tokens} tokens fetched, {fetcher.stats.recomputed_tokens} recomputed")
    if result.loaded_blocks != len(keys):
        raise RuntimeError("the walkthrough's fetch did not load every stored block")


def _lookup(d: CompatDescriptor, scope: ScopeKey, keys: list[bytes]) -> LookupRequest:
    return LookupRequest(scope.scope_id, d.compat_id, tuple(keys))


def _section_placement(record: ReplicaRecord, d: CompatDescriptor) -> None:
    _say(5, "Placement (section 6.4): which instance should serve a 48-token prompt?")
    base = {"epoch": 1, "running": 4, "batch_size": 32, "kv_utilization": 0.5, "decode_tokens_per_s": 3000,
            "ttl_ms": 3000, "requested_state": None, "state": "active"}
    near = InstanceStatus.from_json({**base, "instance": "https://127.0.0.1:7001/ii/", "queued": 1,
                                     "prefill_tokens_per_s": 4000,
                                     "links": [{"holder": HOLDER, "mbit_per_s": 100000, "rtt_us": 20}]})
    far = InstanceStatus.from_json({**base, "instance": "https://127.0.0.1:7002/ii/", "queued": 0,
                                    "prefill_tokens_per_s": 4000, "links": []})
    estimates = [estimate(s, [(record,)], prompt_tokens=48, block_tokens=d.block_tokens, mean_service_us=2000)
                 for s in (near, far)]
    for e in estimates:
        print(f"  {e.instance}: wait {e.wait_us:.0f} us, fetch {e.fetch_us:.1f} us, "
              f"recompute all {e.recompute_us:.0f} us -> cost {e.cost_us:.0f} us (cache used: {e.uses_cache})")
    best = choose_instance(estimates)
    assert best is not None and best.state is InstanceState.ACTIVE
    print(f"  chosen: {best.instance}")


def main(directory: str | None = None) -> None:
    if directory:
        run(Path(directory))
        return
    with tempfile.TemporaryDirectory(prefix="kvsp-demo-") as tmp:
        run(Path(tmp))
