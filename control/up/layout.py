"""The deployment ``kvsp up`` runs, written into one run directory.

    RUN/pki/                 dev CA and one certificate per role (URI SAN = base URI)
    RUN/model.json           the Compatibility Descriptor; RUN/*.scope.key, RUN/acme.apikey
    RUN/main/                role configs, policy.toml (D2), logs/, the cache holder's blocks (the system)
    RUN/baseline/            the same roles without any cache (no holders, no lookups that can hit), names
                             ending in -b, on their own ports: it starts beside the main phase
    RUN/deployment.json      names, URIs, ports and files: what `kvsp workload --run-dir` reads

Processes of the main phase: ``pc`` (PC + IS), ``h1`` (cache-server holder: host + local-storage
tiers), ``relay1`` when the relay role is available, ``ii1`` and ``ii2`` (instance + holder) and ``fe``
(the front end).  Every configuration is plain TOML that ``kvsp serve ROLE --config FILE`` reads.

With ``--backend redis`` (decision D7) the main phase keeps the PC's state in a local Redis that
``kvsp up`` starts itself (``RUN/redis/``, with AOF): ``pc`` and ``pc2`` (two PCs, leader and standby,
one identity: both present the ``pc`` certificate), each with an IS on the same Redis; holders and
instances are configured with both ISs, the instances and the front end with both PCs.  The baseline
phase stays embedded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import secrets
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Final

from control.deploy import configs
from control.deploy.ports import free_port
from control.deploy.supervisor import Proc
from kvsp.descriptor import CompatDescriptor
from kvsp.keys import ScopeKey
from kvsp.pki import RoleSpec, make_dev_pki

TENANTS: Final = ("public", "acme")
INSTANCES: Final = ("ii1", "ii2")
BACKENDS: Final = ("memory", "redis")
PAIR: Final = ("pc", "pc2")  # the PCs of the main phase with backend "redis"
SCRAPER: Final = "up"
HF_BLOCK_TOKENS: Final = 16  # the identity kvsp up itself uses (metrics, health)


@dataclass(frozen=True, slots=True)
class UpOptions:
    model: str = "test"  # "test" (DeterministicTestEngine + bytes tokenizer) or a Hugging Face model folder
    relay: bool | None = None  # None: start the relay when the role is available
    prefill_us_per_token: int = 400  # test engine: the time of a model, so cache reuse shows in TTFT
    decode_us_per_token: int = 4000
    status_ttl_ms: int = 2000
    frontend_port: int = 0  # 0: a free port
    moqt_fetch: bool = False  # instances read the cache holder's blocks over MOQT (its moqt:// replicas)
    backend: str = "memory"  # the main phase's PC state: "memory" (one PC + IS) or "redis" (two PCs, an IS)
    lease_ttl_ms: int = 2000  # backend "redis": the PCs' leader lease


@dataclass(frozen=True, slots=True)
class Deployment:
    run_dir: str
    model: str
    model_name: str
    tokenizer: str
    frontend_urls: Mapping[str, str]  # phase -> the front end's public base URL
    api_keys: Mapping[str, str]  # tenant -> key file (tenants without one are anonymous)
    uris: Mapping[str, str]
    phases: Mapping[str, tuple[Proc, ...]] = field(default_factory=dict)
    redis_port: int | None = None  # backend "redis": the local Redis kvsp up starts (RUN/redis/)

    @property
    def frontend_url(self) -> str:
        return self.frontend_urls["main"]

    def save(self) -> None:
        doc = asdict(self)
        (Path(self.run_dir) / "deployment.json").write_text(json.dumps(doc, indent=2) + "\n")

    @classmethod
    def load(cls, run_dir: Path) -> Deployment:
        doc = json.loads((run_dir / "deployment.json").read_text())
        phases = {name: tuple(Proc(**p) for p in procs) for name, procs in doc["phases"].items()}
        return cls(str(run_dir), doc["model"], doc["model_name"], doc["tokenizer"], doc["frontend_urls"],
                   doc["api_keys"], doc["uris"], phases, doc.get("redis_port"))

    @property
    def redis_url(self) -> str | None:
        return None if self.redis_port is None else f"redis://127.0.0.1:{self.redis_port}/0"

    def pcs(self, phase: str) -> list[str]:
        """The base URIs of the phase's PCs (two with backend "redis")."""
        return [p.uri for p in self.phases[phase] if p.roles.split(",")[0] == "pc"]


def relay_available() -> bool:
    try:
        return importlib.util.find_spec("relay.app") is not None
    except ModuleNotFoundError:
        return False


def bytes_model_descriptor() -> CompatDescriptor:
    digest = hashlib.sha256
    return CompatDescriptor(model="kvsp-test-bytes", model_digest=digest(b"kvsp DeterministicTestEngine").digest(),
                            tokenizer_digest=digest(b"kvsp bytes tokenizer").digest(), layers=2, kv_heads=2,
                            head_dim=16, kv_dtype="fp16", positional="rope", block_tokens=16)


def model_of(options: UpOptions) -> tuple[CompatDescriptor, str, str]:
    """(descriptor, engine setting, tokenizer setting) of the model the instances serve."""
    if options.model == "test":
        return bytes_model_descriptor(), "test", "bytes"
    from kvsp.hf import descriptor_from_model_dir  # noqa: PLC0415 - the reference model needs torch

    folder = Path(options.model).resolve()
    descriptor = descriptor_from_model_dir(folder, block_tokens=HF_BLOCK_TOKENS)
    return descriptor, f"hf:{folder}", str(folder / "tokenizer.json")


# -- the run directory -------------------------------------------------------------------------------------
BASELINE_SUFFIX: Final = "-b"


@dataclass(frozen=True, slots=True)
class _Shared:
    uris: dict[str, str]
    scopes: dict[str, ScopeKey]
    engine: str
    tokenizer: str
    descriptor: CompatDescriptor
    fe_ports: dict[str, int]  # phase -> public port of its front end
    relay: bool
    moqt_ports: dict[str, int]
    redis_url: str | None = None  # backend "redis": the main phase's PCs keep their state there


def phase_names(relay: bool, backend: str = "memory") -> dict[str, list[str]]:
    """The process names of each phase; the baseline runs beside the main phase, on its own ports."""
    control = [*PAIR] if backend == "redis" else ["pc"]
    main = [*control, *(["relay1"] if relay else []), "h1", *INSTANCES, "fe"]  # the relay before its publisher
    return {"main": main, "baseline": [f"{n}{BASELINE_SUFFIX}" for n in ("pc", *INSTANCES, "fe")]}


def prepare(run_dir: Path, options: UpOptions) -> Deployment:
    """Write the PKI, policies, keys and both phases' configs; return what was written."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if options.backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}")
    descriptor, engine, tokenizer = model_of(options)
    relay = relay_available() if options.relay is None else options.relay
    names = phase_names(relay, options.backend)
    uris = {n: f"https://127.0.0.1:{free_port()}/{n}/" for n in [*names["main"], *names["baseline"], SCRAPER]}
    make_dev_pki(run_dir / "pki", [RoleSpec(n, u) for n, u in uris.items()])
    (run_dir / "model.json").write_text(json.dumps(descriptor.to_json()))
    scopes = {t: ScopeKey.generate() for t in TENANTS}
    for tenant, key in scopes.items():
        _write_secret(run_dir / f"{tenant}.scope.key", key.secret().hex())
    _write_secret(run_dir / "acme.apikey", "sk-kvsp-" + secrets.token_hex(24))
    moqt_ports = {n: free_port(socket.SOCK_DGRAM) for n in ("h1", "relay1")}
    fe_ports = {"main": options.frontend_port or free_port(), "baseline": free_port()}
    redis_port = free_port() if options.backend == "redis" else None
    redis_url = None if redis_port is None else f"redis://127.0.0.1:{redis_port}/0"
    shared = _Shared(uris, scopes, engine, tokenizer, descriptor, fe_ports, relay, moqt_ports, redis_url)
    phases = {phase: _write_phase(run_dir, phase, shared, options, names[phase]) for phase in ("main", "baseline")}
    model_name = "kvsp-test" if engine == "test" else descriptor.model
    deployment = Deployment(str(run_dir), options.model, model_name, tokenizer,
                            {p: f"http://127.0.0.1:{port}" for p, port in fe_ports.items()},
                            {"acme": "acme.apikey"}, uris, phases, redis_port)
    deployment.save()
    return deployment


def _write_secret(path: Path, text: str) -> None:
    path.touch(mode=0o600)
    path.write_text(text + "\n")


def _policy(pc: str, instances: Sequence[str], members: Sequence[str],
            scopes: Mapping[str, ScopeKey]) -> configs.PolicyFile:
    # The PC takes status and checkpoints from the listed instances only (D2): every other member has
    # a certificate of the same CA, and the PC sends an instance the prompts of its sessions.
    return configs.PolicyFile(pc, instances,
                              [configs.ScopeEntry.open_to(key.scope_id, members) for key in scopes.values()])


def _write_phase(run_dir: Path, phase: str, s: _Shared, options: UpOptions, names: Sequence[str]) -> tuple[Proc, ...]:
    """One phase's configs: ``main`` with the cache roles, ``baseline`` (names ending -b) without them."""
    folder = run_dir / phase
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    cache = phase == "main"
    suffix = "" if cache else BASELINE_SUFFIX
    uri = {n.removesuffix(suffix) if suffix else n: s.uris[n] for n in names}
    _policy(uri["pc"], [uri[n] for n in INSTANCES], list(uri.values()), s.scopes).write(folder / "policy.toml")
    keys = {key.scope_id.hex(): f"../{tenant}.scope.key" for tenant, key in s.scopes.items()}
    model = "../model.json"
    procs: list[Proc] = []

    def write(role: str, roles: list[str], *sections: configs.Section, instance: bool = False,
              cert: str | None = None) -> None:
        name = role + suffix
        tls = configs.Tls.of(cert or name, "../pki")
        configs.RoleFile(roles, uri[role], tls, "policy.toml", sections=sections).write(folder / f"{name}.toml")
        procs.append(Proc(name, ",".join(roles), uri[role], f"{phase}/{name}.toml", f"{phase}/logs/{name}.log",
                          instance))

    index, pcs = _control_plane(write, uri, s, options, keys=keys, model=model,
                                pair=cache and s.redis_url is not None)
    holder = configs.HolderSection(index=index, descriptors=[model], replica_ttl_ms=120_000)
    h1_moqt = f"127.0.0.1:{s.moqt_ports['h1']}"
    relay_uri = f"moqt://127.0.0.1:{s.moqt_ports['relay1']}/relay1" if s.relay else None
    moqt_source = relay_uri or f"moqt://{h1_moqt}/h1"  # where the instances read moqt replicas
    if cache:
        h1 = replace(holder, host_capacity_octets=64 << 20, storage_dir="blocks-h1", storage_capacity_octets=1 << 30,
                     encryption_key_file="h1-storage.key", moqt_listen=h1_moqt, moqt_uri=f"moqt://{h1_moqt}/h1")
        if relay_uri is not None:  # the rack relay (D4): h1 publishes through it, its moqt records name it
            port = s.moqt_ports["relay1"]
            write("relay1", ["relay"],
                  configs.RelaySection(listen=f"127.0.0.1:{port}", uri=relay_uri, cache_octets=64 << 20))
            h1 = replace(h1, moqt_relay=relay_uri)
        write("h1", ["holder"], h1)
    for name in INSTANCES:
        instance = replace(_instance_section(s, options, uri, keys, model), pc=pcs, index=index)
        if cache:
            peers = [p for p in INSTANCES if p != name]
            links = [configs.HolderLink(uri[h], 10_000.0, 100) for h in ("h1", *peers)]
            if options.moqt_fetch:  # the cache holder's moqt:// replicas are priced over their own path
                links = [configs.HolderLink(moqt_source, 10_000.0, 50), *links]
            instance = replace(instance, replicate_to=[uri["h1"]], peers=[uri[p] for p in peers],
                               moqt_fetch=options.moqt_fetch, links=links,
                               moqt_relay=relay_uri if options.moqt_fetch else None)
            write(name, ["instance", "holder"], holder, instance, instance=True)
        else:  # no holder role and no block memory: every prompt is recomputed
            write(name, ["instance"], replace(instance, memory_blocks_octets=0), instance=True)
    tenants = {t: k.scope_id.hex() for t, k in s.scopes.items()}
    model_name = "kvsp-test" if s.engine == "test" else s.descriptor.model
    write("fe", ["frontend"], configs.FrontendSection(
        pc=pcs, listen=f"127.0.0.1:{s.fe_ports[phase]}", model=model_name, descriptor=model,
        tokenizer=s.tokenizer, tenants=tenants, api_keys={"acme": "../acme.apikey"},
        anonymous_tenant="public", stall_ms=1000))
    return tuple(procs)



def _control_plane(write: Callable[..., None], uri: Mapping[str, str], s: _Shared, options: UpOptions, *,
                   keys: dict[str, str], model: str, pair: bool) -> tuple[str | list[str], str | list[str]]:
    """The PC and IS configs; returns the IS and PC URIs the other roles are configured with."""
    pc_section = configs.PcSection(scope_keys=keys, descriptors=[model], status_check_interval_ms=100,
                                   call_timeout_ms=5000)
    if not pair:
        write("pc", ["pc", "is"], configs.IndexSection(descriptors=[model]), pc_section)
        return uri["pc"], uri["pc"]
    assert s.redis_url is not None
    # each PC process runs an IS too, both on the same Redis (keys apart by prefix): the index and the
    # status board that prices lookup targets are shared, and clients fail over between the two ISs
    redis = configs.RedisTable(s.redis_url)
    is_section = configs.IndexSection(descriptors=[model], backend="redis", redis=redis)
    pc_section = replace(pc_section, backend="redis", lease_ttl_ms=options.lease_ttl_ms, redis=redis)
    for name in PAIR:  # one PC identity (the policy's, D2): both present the pc certificate
        write(name, ["pc", "is"], is_section, pc_section, cert="pc")
    both = [uri[n] for n in PAIR]
    return both, both

def _instance_section(s: _Shared, options: UpOptions, uri: Mapping[str, str], keys: Mapping[str, str],
                      model: str) -> configs.InstanceSection:
    instance = configs.InstanceSection(
        pc=uri["pc"], index=uri["pc"], engine=s.engine, scope_keys=dict(keys), descriptors=[model],
        status_ttl_ms=options.status_ttl_ms, load_timeout_ms=5000, final_ack_timeout_ms=10_000)
    if s.engine == "test":
        return replace(instance, vocab_size=256, test_prefill_us_per_token=options.prefill_us_per_token,
                       test_decode_us_per_token=options.decode_us_per_token)
    # prompts computed block by block: loaded and recomputed prefixes give bit-identical logits
    return replace(instance, hf_chunk_tokens=s.descriptor.block_tokens)
