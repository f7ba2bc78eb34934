"""What an operator reads when clients misbehave: log records of a ``kvsp serve`` holder under bad input.

One holder process (HTTPS and MOQT, ``kvsp serve holder``, run from a source tree given by ``--tree``)
gets ``per_case`` requests of each kind below from this process, every one of them the client's fault;
its stderr is then counted: records by level, tracebacks, and lines per bad request.

* ``bad-json``, ``bad-type``, ``bad-key``, ``oversize``: malformed lease bodies, a wrong media type, a
  block key that is not hex, a ``Content-Length`` over the body limit (400, 415, 400, 413);
* ``unknown-route``: ``GET`` of a path the holder does not serve (404);
* ``cut-body``: a block ``PUT`` whose client goes away after a tenth of the body it announced;
* ``cut-response``: a ``GET`` of a 512 KiB block whose client resets the connection before reading it;
* ``bad-http``: a request with a header line that is not HTTP;
* ``no-cert``: a TLS client without a certificate; ``plain-tcp``: plain text to the TLS port;
* ``moqt-setup-fin``: a MOQT client that sends CLIENT_SETUP and closes the control stream with it.

Goals: no ERROR record and no traceback (none of this is the server's fault), and at most one line
per bad request; a flood of one kind collapses to a few lines (the rate limit of kvsp/service/logs.py).

Run: ``python -m benchmarks.bench_log_noise [--quick] [--tree DIR] [--compare DIR]``; ``--tree`` measures
another checkout (e.g. the tree before a change), ``--compare`` measures this one and DIR in one run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

from aioquic.quic import events as qe

from benchmarks.timing import add_check, case
from benchmarks.trees import ROOT, print_run, tree_parser
from control.deploy import configs
from control.deploy.pki import DevPki
from control.deploy.ports import free_udp_port
from control.deploy.processes import StartError, stop_all, wait_listening
from kvsp.container import encode_container
from kvsp.descriptor import CompatDescriptor
from kvsp.registry import Codec
from moqt.messages.setup import ClientSetup
from moqt.params import SetupParameters
from moqt.profiles import DRAFT_14
from moqt.quic import EndpointConfig, MoqtConnection, QuicSettings, connect

SCOPE = bytes(range(16))
# 8 layers of 16 tokens x 8 heads x 128 dims in bf16: 32 KiB per K or V section, 512 KiB per block
DESCRIPTOR = CompatDescriptor(model="noise", model_digest=bytes(32), tokenizer_digest=bytes(32), layers=8,
                              kv_heads=8, head_dim=128, kv_dtype="bf16", positional="rope", block_tokens=16)
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
Send = Callable[[int], Awaitable[object]]


class Probe:
    """The holder under test and the raw clients that misbehave at it."""

    def __init__(self, folder: Path, tree: Path = ROOT, env: dict[str, str] | None = None) -> None:
        self.folder, self.tree, self.env = folder, tree, env or {}
        self.pki = DevPki.make(folder / "pki", ["holder", "client"])
        self.base = self.pki.uri("holder")
        self.moqt_port = free_udp_port()
        self.compat = DESCRIPTOR.compat_id.hex()
        self.block = encode_container(Codec.RAW, 0, DESCRIPTOR.block_tokens,
                                      [(os.urandom(32 << 10), os.urandom(32 << 10)) for _ in range(DESCRIPTOR.layers)])
        self.key = "ab" * 32
        self.ssl = self.pki.client_ssl("client")
        self.anonymous = ssl.create_default_context(cafile=str(self.pki.dir / "ca.pem"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = folder / "holder.log"

    # -- the holder -----------------------------------------------------------------------------------
    def write_config(self) -> Path:
        """The holder's role file (and its policy and descriptor) in the folder; returns its path."""
        (self.folder / "model.json").write_text(json.dumps(DESCRIPTOR.to_json()))
        members = [self.pki.uri("client")]
        configs.PolicyFile(scopes=[configs.ScopeEntry.open_to(SCOPE, members)]).write(self.folder / "policy.toml")
        section = configs.HolderSection(descriptors=["model.json"], host_capacity_octets=64 << 20,
                                        moqt_listen=f"127.0.0.1:{self.moqt_port}",
                                        moqt_uri=f"moqt://127.0.0.1:{self.moqt_port}/holder")
        return configs.RoleFile(["holder"], self.base, configs.Tls.of("holder", "pki"), "policy.toml",
                                sections=[section]).write(self.folder / "holder.toml")

    async def start(self, *args: str) -> None:
        """``kvsp serve holder`` (with ``args``) from the tree, its output in `log`, the probe block stored."""
        env = {**os.environ, "PYTHONPATH": str(self.tree), "PYTHONUNBUFFERED": "1", **self.env}
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "control.cli", "serve", "holder", "--config",
                                          str(self.write_config()), *args], cwd=self.folder, env=env, stdout=out,
                                         stderr=out)
        await wait_listening("holder", self.pki.port("holder"), self.proc, log=self.log)
        await self.store_block()

    async def store_block(self) -> None:
        """The 512 KiB block that ``cut-response`` reads."""
        status, _ = await self.request(f"PUT {self.path('blocks/' + self.block_path())} HTTP/1.1",
                                       {"If-None-Match": "*", "Content-Type": "application/kvsp-block"}, self.block)
        if status != 201:
            raise StartError(f"the holder did not store the probe block ({status})")

    def stop(self) -> str:
        if self.proc is not None:
            stop_all([self.proc])
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def path(self, rest: str) -> str:
        return self.base.split("/", 3)[3].join(("/", "")) + rest

    def block_path(self) -> str:
        return f"{self.compat}/{SCOPE.hex()}/{self.key}"

    # -- raw clients ----------------------------------------------------------------------------------
    async def open(self, context: ssl.SSLContext | None = None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.pki.port("holder"), ssl=context or self.ssl,
                                             server_hostname="127.0.0.1")

    async def request(self, line: str, headers: dict[str, str], body: bytes = b"") -> tuple[int, bytes]:
        reader, writer = await self.open()
        try:
            head = {"Host": "127.0.0.1", "Content-Length": str(len(body)), "Connection": "close", **headers}
            writer.write((line + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in head.items()) + "\r\n").encode() + body)
            data = await asyncio.wait_for(reader.read(), 10)
            return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0, data
        finally:
            await _close(writer)

    async def bad_json(self, _: int) -> None:
        await self.request(f"POST {self.path('leases')} HTTP/1.1", {"Content-Type": "application/json"}, b"{")

    async def bad_type(self, _: int) -> None:
        await self.request(f"POST {self.path('leases')} HTTP/1.1", {"Content-Type": "text/plain"}, b"{}")

    async def bad_key(self, _: int) -> None:
        await self.request(f"GET {self.path(f'blocks/{self.compat}/{SCOPE.hex()}/zz')} HTTP/1.1", {})

    async def oversize(self, _: int) -> None:
        reader, writer = await self.open()
        writer.write(f"POST {self.path('leases')} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {8 << 20}\r\n\r\n".encode())
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            await asyncio.wait_for(reader.read(4096), 10)
        await _close(writer)

    async def unknown_route(self, _: int) -> None:
        await self.request("GET /nothing/here HTTP/1.1", {})

    async def cut_body(self, i: int) -> None:
        key = f"{i:064x}"
        _, writer = await self.open()
        writer.write(f"PUT {self.path(f'blocks/{self.compat}/{SCOPE.hex()}/{key}')} HTTP/1.1\r\nHost: x\r\n"
                     f"If-None-Match: *\r\nContent-Type: application/kvsp-block\r\n"
                     f"Content-Length: {len(self.block)}\r\n\r\n".encode() + self.block[: len(self.block) // 10])
        await writer.drain()
        await asyncio.sleep(0.01)
        _reset(writer)

    async def cut_response(self, _: int) -> None:
        reader, writer = await self.open()
        writer.write(f"GET {self.path('blocks/' + self.block_path())} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        _reset(writer)

    async def bad_http(self, _: int) -> None:
        reader, writer = await self.open()
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nthis is not a header\r\n\r\n")
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            await asyncio.wait_for(reader.read(), 10)
        await _close(writer)

    async def no_cert(self, _: int) -> None:
        with contextlib.suppress(OSError, ssl.SSLError, asyncio.TimeoutError):
            reader, writer = await self.open(self.anonymous)
            writer.write(f"GET {self.path('health')} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            await asyncio.wait_for(reader.read(), 10)
            await _close(writer)

    async def plain_tcp(self, _: int) -> None:
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            reader, writer = await asyncio.open_connection("127.0.0.1", self.pki.port("holder"))
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            await asyncio.wait_for(reader.read(), 10)
            await _close(writer)

    async def moqt_setup_fin(self, _: int) -> MoqtConnection[object]:
        """CLIENT_SETUP and FIN in one frame; returns the connection once the holder has closed it.
        Draft-14's CLIENT_SETUP (the drafts' setup messages differ), so the client offers draft-14 only."""
        d = self.pki.dir
        config = EndpointConfig.from_files(d / "client.pem", d / "client.key", d / "ca.pem",
                                           QuicSettings(idle_timeout_s=5.0, drafts=(14,)))
        conn = await connect(f"moqt://127.0.0.1:{self.moqt_port}/holder", config, SetupThenFin)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(conn.wait_closed(), 5)
        conn.close()
        return conn


class SetupThenFin:
    """A client session that sends CLIENT_SETUP and the control stream's FIN in one frame."""

    def __init__(self, conn: MoqtConnection[object]) -> None:
        self.conn = conn

    def handle_event(self, event: qe.QuicEvent) -> list[object]:
        if isinstance(event, qe.HandshakeCompleted):
            stream = self.conn.quic.get_next_available_stream_id()
            setup = ClientSetup((DRAFT_14.version,), SetupParameters(path="/holder"))
            self.conn.quic.send_stream_data(stream, setup.encode(), end_stream=True)
        return []


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError, ssl.SSLError, asyncio.TimeoutError):
        await asyncio.wait_for(writer.wait_closed(), 5)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0): the client is gone, as a crashed or killed one is."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


CASES = ("bad-json", "bad-type", "bad-key", "oversize", "unknown-route", "cut-body", "cut-response", "bad-http",
         "no-cert", "plain-tcp", "moqt-setup-fin")


def count(log: str) -> dict[str, int]:
    """Records by level (a record starts with a level word, in the text or the JSON format) and tracebacks."""
    levels: Counter[str] = Counter()
    for line in log.splitlines():
        level = _level_of(line)
        if level is not None:
            levels[level] += 1
    return {"lines": len(log.splitlines()), "tracebacks": log.count("Traceback (most recent call last)"),
            **{level.lower(): levels[level] for level in LEVELS}}


def _level_of(line: str) -> str | None:
    if line.startswith("{"):
        with contextlib.suppress(ValueError):
            level = json.loads(line).get("level")
            return level if level in LEVELS else None
    return next((w for w in line.split()[:6] if w in LEVELS), None)


async def measure(tree: Path, per_case: int) -> dict[str, object]:
    """Send ``per_case`` of each bad request to a holder run from ``tree``; count its log, per case."""
    with tempfile.TemporaryDirectory(prefix="kvsp-noise-") as tmp:
        probe = Probe(Path(tmp), tree)
        try:
            await probe.start()
            per: dict[str, dict[str, int]] = {}
            for name in CASES:
                before = count(probe.log.read_text(errors="replace"))
                send: Send = getattr(probe, name.replace("-", "_"))
                for i in range(per_case):
                    await send(i)
                await asyncio.sleep(0.3)  # the server logs after the client has gone
                after = count(probe.log.read_text(errors="replace"))
                per[name] = {k: after[k] - before[k] for k in after}
        finally:
            log = probe.stop()
    total = {k: sum(c[k] for c in per.values()) for k in next(iter(per.values()))}
    return {"tree": str(tree), "requests": per_case * len(CASES), "total": total, "per_case": per,
            "tail": log[-1500:]}


def rows(result: dict[str, object], baseline: dict[str, object] | None) -> list[dict[str, object]]:
    total = result["total"]
    assert isinstance(total, dict)
    requests = result["requests"]
    assert isinstance(requests, int)
    before = baseline["total"] if baseline is not None else None
    assert before is None or isinstance(before, dict)
    out = []
    for field, goal in (("error", "no ERROR record for the clients' faults"),
                        ("tracebacks", "no traceback for the clients' faults")):
        row = case(f"bad_input_{field}", total[field], before[field] if before else None, goal, unit="records")
        out.append(add_check(row, "value", "<=", 0))
    lines = case("bad_input_lines_per_request", round(total["lines"] / requests, 3),
                 round(before["lines"] / requests, 3) if before else None,
                 "at most one line per bad request (a flood: a few lines)", unit="lines")
    out.append(add_check(lines, "value", "<=", 1.0))
    return out


def run(quick: bool = False, *, tree: Path = ROOT, compare: Path | None = None) -> dict[str, object]:
    per_case = 20 if quick else 200

    async def main() -> tuple[dict[str, object], dict[str, object] | None]:
        baseline = await measure(compare, per_case) if compare is not None else None
        return await measure(tree, per_case), baseline

    result, baseline = asyncio.run(main())
    params: dict[str, object] = {"per_case": per_case, "cases": list(CASES), "tree": str(tree),
                                 "per_case_counts": result["per_case"]}
    if baseline is not None:
        params |= {"baseline_tree": str(compare), "baseline_per_case_counts": baseline["per_case"]}
    return {"name": "log_noise", "params": params, "cases": rows(result, baseline)}


def _main() -> None:
    parser = tree_parser(__doc__)
    parser.add_argument("--tail", action="store_true", help="print the tail of each holder's log too")
    args = parser.parse_args()
    if args.tail:
        per_case = 20 if args.quick else 200
        for tree in (args.tree, *([args.compare] if args.compare else [])):
            print(json.dumps(asyncio.run(measure(tree, per_case)), indent=2))
        return
    print_run(run, args)


if __name__ == "__main__":
    _main()
