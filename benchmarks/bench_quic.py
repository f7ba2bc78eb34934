"""Raw QUIC stream throughput on loopback: our adapter (moqt/quic/) vs aioquic's stock asyncio one.

One client process sends N octets on one bidirectional stream to a sink in a second process (so
sender and receiver each have a core), which answers ``ok`` + FIN once it has the FIN; the time runs
from the first write to that answer, on an established connection (a new one per repetition, so slow
start is included for both). Both sides use the same QuicConfiguration knobs (flow-control windows,
congestion control); what differs is the adapter: batched reads with one transmit per batch, 4 MiB
socket buffers, write backpressure and STREAM frames longer than 16383 octets (ours) vs a
transmit after every datagram, default socket buffers and the whole payload queued at once (stock).

* ``stream_*_datagram_{size}``: ours at ``size`` against stock at ``min(size, 16000)``: 16000 is the
  largest datagram stock aioquic can use (its STREAM frame Length is 14 bits), so the 65488 row shows
  what the larger frames of ``HookedQuicConnection`` buy. Sizes: 1452 (Ethernet), 8952 (jumbo
  frames), 16000, 65488 (loopback). Goal: ours >= 1.0x stock (ratio = stock time / our time).
* ``gso_*_datagram_{size}``: ours with UDP GSO (``QuicSettings.gso``, off by default) against ours
  without, for the LAN sizes where one transmit yields many datagrams. Informational: ratio > 1
  means GSO helps.

MB/s are 10^6 octets per second. Run: ``python -m benchmarks.bench_quic [--quick]``; prints JSON.
"""

from __future__ import annotations

import asyncio
import functools
import json
import multiprocessing as mp
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path

from aioquic.asyncio.client import connect as stock_connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import serve as stock_serve
from aioquic.quic import events as qe
from aioquic.quic.configuration import QuicConfiguration

from benchmarks.timing import Sample, case
from kvsp.pki import RoleSpec, make_dev_pki
from moqt.quic import ALPN, EndpointConfig, MoqtConnection, QuicSettings, connect, serve

MiB = 1 << 20
SIZES = (1452, 8952, 16000, 65488)
GSO_SIZES = (1452, 8952)
STOCK_MAX = 16000  # stock aioquic corrupts STREAM frame lengths above 16383 octets
SERVER_URI = "moqt://127.0.0.1:4433/bench"
CLIENT_URI = "https://bench-client.test/"


def _settings(size: int, gso: bool = False) -> QuicSettings:
    return QuicSettings(max_datagram_size=size, loopback_datagram_size=size, gso=gso)


def _stock_configuration(size: int, is_client: bool, pki: Path) -> QuicConfiguration:
    s = _settings(size)
    qc = QuicConfiguration(is_client=is_client, alpn_protocols=[ALPN], max_datagram_size=size, max_data=s.max_data,
                           max_stream_data=s.max_stream_data, congestion_control_algorithm=s.congestion_control,
                           idle_timeout=s.idle_timeout_s)
    qc.initial_rtt = s.initial_rtt_s
    if is_client:
        qc.verify_mode = 0  # ssl.CERT_NONE: aioquic's own check cannot parse our URI SANs
    else:
        qc.load_cert_chain(pki / "server.pem", pki / "server.key")
    return qc


# -- the sink process ----------------------------------------------------------------------------------
class _Sink:
    """Our side: counts octets and answers ``ok`` + FIN on the stream's FIN."""

    def __init__(self, conn: MoqtConnection[None]) -> None:
        self.conn = conn

    def handle_event(self, event: qe.QuicEvent) -> list[None]:
        if isinstance(event, qe.StreamDataReceived) and event.end_stream:
            self.conn.quic.send_stream_data(event.stream_id, b"ok", end_stream=True)
        return []


class _StockSink(QuicConnectionProtocol):
    def quic_event_received(self, event: qe.QuicEvent) -> None:
        if isinstance(event, qe.StreamDataReceived) and event.end_stream:
            self._quic.send_stream_data(event.stream_id, b"ok", end_stream=True)
            self.transmit()


async def _sink_main(pki: Path, pipe: Connection) -> None:
    ports: dict[str, int] = {}
    ours_servers, stock_servers = [], []
    for size, gso in [(size, False) for size in SIZES] + [(size, True) for size in GSO_SIZES]:
        config = EndpointConfig.from_files(pki / "server.pem", pki / "server.key", pki / "ca.pem", _settings(size, gso))
        ours = await serve("127.0.0.1", 0, config, _Sink)
        ours_servers.append(ours)
        ports[_key("ours", size, gso)] = ours.port
    for size in sorted({min(size, STOCK_MAX) for size in SIZES}):
        stock = await stock_serve("127.0.0.1", 0, configuration=_stock_configuration(size, False, pki),
                                  create_protocol=_StockSink)
        stock_servers.append(stock)
        ports[_key("stock", size)] = stock._transport.get_extra_info("sockname")[1]  # type: ignore[union-attr]
    pipe.send(ports)
    await asyncio.get_running_loop().run_in_executor(None, pipe.recv)  # wait for "stop"
    for ours in ours_servers:
        ours.close()
    for stock in stock_servers:
        stock.close()


def _key(kind: str, size: int, gso: bool = False) -> str:
    return f"{kind}-{size}{'-gso' if gso else ''}"


def _sink_process(pki: str, pipe: Connection) -> None:
    asyncio.run(_sink_main(Path(pki), pipe))


# -- the client side -------------------------------------------------------------------------------------
async def _ours_once(port: int, size: int, payload: bytes, pki: Path, gso: bool = False) -> float:
    config = EndpointConfig.from_files(pki / "client.pem", pki / "client.key", pki / "ca.pem", _settings(size, gso))
    reply: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    async with await connect(f"moqt://127.0.0.1:{port}/bench", config, lambda c: _ReplyWatcher(reply)) as conn:
        stream_id = conn.quic.get_next_available_stream_id()
        start = time.perf_counter()
        await conn.write(stream_id, payload, end_stream=True)
        await asyncio.wait_for(reply, 120)
        return time.perf_counter() - start


class _ReplyWatcher:
    def __init__(self, reply: asyncio.Future[None]) -> None:
        self.reply = reply

    def handle_event(self, event: qe.QuicEvent) -> list[None]:
        if isinstance(event, qe.StreamDataReceived) and event.end_stream and not self.reply.done():
            self.reply.set_result(None)
        return []


class _StockClient(QuicConnectionProtocol):
    reply: asyncio.Future[None] | None = None

    def quic_event_received(self, event: qe.QuicEvent) -> None:
        if isinstance(event, qe.StreamDataReceived) and event.end_stream and self.reply is not None:
            self.reply.set_result(None)


async def _stock_once(port: int, size: int, payload: bytes, pki: Path) -> float:
    async with stock_connect("127.0.0.1", port, configuration=_stock_configuration(size, True, pki),
                             create_protocol=_StockClient) as client:
        assert isinstance(client, _StockClient)
        client.reply = asyncio.get_running_loop().create_future()
        stream_id = client._quic.get_next_available_stream_id()
        start = time.perf_counter()
        client._quic.send_stream_data(stream_id, payload, end_stream=True)
        client.transmit()
        await asyncio.wait_for(client.reply, 120)
        return time.perf_counter() - start


def _sample(once: Callable[[], Awaitable[float]], reps: int, warmup: int) -> Sample:
    async def series() -> list[float]:
        return [await once() for _ in range(warmup + reps)][warmup:]

    times = asyncio.run(series())
    return Sample.of(times)


def _rows(ports: dict[str, int], pki: Path, total: int, reps: int, warmup: int) -> list[dict[str, object]]:
    payload = bytes(total)
    rows = []
    for size in SIZES:
        stock_size = min(size, STOCK_MAX)
        ours = _sample(functools.partial(_ours_once, ports[_key("ours", size)], size, payload, pki), reps, warmup)
        stock = _sample(functools.partial(_stock_once, ports[_key("stock", stock_size)], stock_size, payload, pki),
                        reps, warmup)
        row = case(f"stream_{total // MiB}mib_datagram_{size}", ours, stock,
                   "ours >= 1.0x stock aioquic.asyncio (ratio = stock time / our time)", higher_is_better=True,
                   goal_min_ratio=1.0)
        row["stock_datagram_size"] = stock_size
        row["mb_per_s"] = {"ours": _mb_per_s(total, ours), "stock": _mb_per_s(total, stock)}
        rows.append(row)
    for size in GSO_SIZES:
        with_gso = _sample(functools.partial(_ours_once, ports[_key("ours", size, True)], size, payload, pki, True),
                           reps, warmup)
        without = _sample(functools.partial(_ours_once, ports[_key("ours", size)], size, payload, pki), reps, warmup)
        row = case(f"gso_{total // MiB}mib_datagram_{size}", with_gso, without,
                   "informational: UDP GSO on vs off (ratio > 1: GSO faster)", higher_is_better=True)
        row["mb_per_s"] = {"gso": _mb_per_s(total, with_gso), "no_gso": _mb_per_s(total, without)}
        rows.append(row)
    return rows


def _mb_per_s(total: int, sample: Sample) -> float:
    return round(total / sample.median_s / 1e6, 1)


def run(quick: bool = False) -> dict[str, object]:
    total, reps, warmup = (16 * MiB, 2, 1) if quick else (64 * MiB, 5, 1)
    with tempfile.TemporaryDirectory() as tmp:
        pki = Path(tmp)
        make_dev_pki(pki, [RoleSpec("server", SERVER_URI), RoleSpec("client", CLIENT_URI)])
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        sink = ctx.Process(target=_sink_process, args=(str(pki), child), daemon=True)
        sink.start()
        try:
            ports: dict[str, int] = parent.recv()
            rows = _rows(ports, pki, total, reps, warmup)
        finally:
            parent.send("stop")
            sink.join(10)
            if sink.is_alive():
                sink.terminate()
    return {"name": "quic", "params": {"octets": total, "datagram_sizes": list(SIZES), "gso_sizes": list(GSO_SIZES),
                                       "stock_max_datagram_size": STOCK_MAX, "reps": reps,
                                       "processes": "client and sink in separate processes"},
            "cases": rows}


def main(argv: Sequence[str]) -> None:
    print(json.dumps(run(quick="--quick" in argv), indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
