"""The MOQT relay (relay/): fan-out, cache hits, and the cost of the hop, on loopback.

Three processes: the relay (``relay.server.Relay``), a publisher (``moqt.api.Publisher``: blocks of 32
objects of 64 KiB = 2 MiB, stored for FETCH; live tracks on command) that listens directly *and* is
connected to the relay, and the subscribers (this process). Mutual TLS 1.3 throughout.

* ``fanout_1_to_N`` (N = 1, 4, 16): N subscribers SUBSCRIBE one live track through the relay, then the
  publisher publishes it (``octets``); the time runs until every subscriber has every object. Goals:
  the relay's upstream octets stay 1x the track whatever N (``upstream_ratio`` == 1.0), and the
  aggregate downstream throughput at 16 is >= 0.8x that at 1.
* ``fetch_cache_hit_vs_miss``: FETCH of a whole block through the relay, a block fetched before (hit)
  against one never fetched (miss: relay -> publisher); goal: hit <= 1.0x miss.
* ``relay_hop_first_object`` / ``relay_hop_block``: FETCH through the relay (miss) against FETCH from the
  publisher directly: first-object latency (goal <= 1.3x) and whole-block throughput (goal >= 0.8x). The
  relay passes pieces on as they arrive (``relay.cutthrough``); ``relay_cut_through_objects`` counts them.
* ``relay_hit_first_object`` / ``relay_hit_block``: the same through the relay on a cache hit against
  direct (no goal): what every reader in the rack after the first one gets.
* ``chain_miss_vs_one_relay`` / ``chain_hit_vs_direct`` / ``chain_upstream_fetches``: a second relay (a rack
  relay) whose upstream is the first (the spine): a FETCH through both (miss at both hops) against a
  miss through one relay, and the repeated FETCH at the rack relay (a hit: no upstream request, counted)
  against direct. No latency goal for two hops; the goal is that the repeat sends nothing upstream.
* ``cpu_per_block_miss_vs_direct``: CPU seconds per block of all three processes (``cpu_ms`` per process),
  via the relay (miss) against direct; when the cores are saturated, ``relay_hop_block`` cannot beat its
  inverse.

The machine's cores are shared with other work, so figures move between runs; each pair is measured
in alternation. Run: ``python -m benchmarks.bench_relay [--quick] [--fetch-only] [--profile FILE]
[--relay-ack-delay S] [--relay-recv-batch N]``; prints JSON. ``--profile`` writes a cProfile (CPU time)
of the relay process over 10 misses (``python -m pstats FILE``); the last two options compare QUIC
settings against the relay's (``relay.settings.RELAY_QUIC``).
"""

from __future__ import annotations

import asyncio
import cProfile
import dataclasses
import json
import multiprocessing as mp
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from benchmarks.timing import Sample, add_check, case
from kvsp.client.moqt import BLOCK_CLIENT_QUIC
from kvsp.pki import RoleSpec, make_dev_pki
from moqt.api import MemoryTrackSource, MoqtObject, Publisher, Subscriber, UpstreamLink, allow_authenticated
from moqt.quic import EndpointConfig, QuicSettings
from moqt.wire import Location, Namespace
from relay.core import RelayStats
from relay.server import Relay
from relay.settings import RELAY_QUIC, RelaySettings

MiB = 1 << 20
OBJECT = 64 << 10
LAYERS = 32
ROLES = {"relay": "moqt://127.0.0.1/relay", "relay2": "moqt://127.0.0.1/relay2",
         "publisher": "https://127.0.0.1/bench-publisher/",
         "subscriber": "https://bench-subscriber.test/"}
TRACK = b"raw"
PROFILED_MISSES = 10
CPU_BLOCKS = 8


def _config(pki: Path, name: str, settings: QuicSettings | None = None) -> EndpointConfig:
    return EndpointConfig.from_files(pki / f"{name}.pem", pki / f"{name}.key", pki / "ca.pem", settings)


def block_ns(i: int) -> Namespace:
    return (b"bench", b"blocks", str(i).encode())


def live_ns(name: str) -> Namespace:
    return (b"bench", b"live", name.encode())


# -- the relay process ---------------------------------------------------------------------------------
async def _relay_main(pki: Path, conn: Connection, quic: QuicSettings, name: str = "relay",
                      upstream: tuple[str, ...] = ()) -> None:
    settings = RelaySettings("127.0.0.1", 0, f"moqt://127.0.0.1:1/{name}", upstream=upstream, cache_octets=1 << 30,
                             subscriber_buffer_octets=512 * MiB)
    relay = Relay(settings, authorize=allow_authenticated)
    port = await relay.listen("127.0.0.1", 0, _config(pki, name, quic))
    links = [UpstreamLink(relay, uri, _config(pki, name, quic)) for uri in upstream]  # as relay.app does
    for link in links:
        link.start()
        await link.wait_connected(30.0)
    conn.send(port)
    profile: cProfile.Profile | None = None
    while (command := await asyncio.to_thread(conn.recv)) != "stop":
        if command == "profile":  # the relay's event loop only (conn.recv waits in another thread)
            profile = cProfile.Profile(time.process_time)  # CPU time: preemption on a loaded machine is not ours
            profile.enable()
            conn.send("ok")
        elif isinstance(command, tuple) and command[0] == "profile_dump" and profile is not None:
            profile.disable()
            profile.dump_stats(command[1])
            profile = None
            conn.send("ok")
        elif command == "cpu":
            conn.send(time.process_time())
        elif command == "stats":
            conn.send(relay.stats.to_json())
        elif command == "reset":
            for name in RelayStats.__slots__:
                if name != "subscribers":
                    setattr(relay.stats, name, 0)
            conn.send("ok")
    for link in links:
        await link.close()
    await relay.close()


def _relay_process(pki: str, conn: Connection, quic: QuicSettings, name: str = "relay",
                   upstream: tuple[str, ...] = ()) -> None:
    asyncio.run(_relay_main(Path(pki), conn, quic, name, upstream))


# -- the publisher process -----------------------------------------------------------------------------
async def _publisher_main(pki: Path, relay_uri: str, blocks: int, conn: Connection) -> None:
    source = MemoryTrackSource()
    for i in range(blocks):
        source.put(block_ns(i), TRACK, [MoqtObject(0, layer, memoryview(bytes([i % 251]) * OBJECT))
                                        for layer in range(LAYERS)])
    publisher = Publisher(source, authorize=allow_authenticated)
    port = await publisher.listen("127.0.0.1", 0, _config(pki, "publisher"))
    await publisher.connect_relay(relay_uri, _config(pki, "publisher"))
    await publisher.publish_namespace((b"bench",))
    conn.send(port)
    tracks = {}
    while (command := await asyncio.to_thread(conn.recv)) != "stop":
        if command == "cpu":
            conn.send(time.process_time())
            continue
        verb, name, octets = command
        if verb == "open":  # the track exists before anyone subscribes, as a block being produced does
            tracks[name] = publisher.track(live_ns(name), TRACK)
            conn.send("opened")
            continue
        track = tracks.pop(name)
        payload = memoryview(bytes(OBJECT))
        for i in range(octets // OBJECT):
            track.publish(0, i, payload)
            if i % 16 == 15:
                await asyncio.sleep(0)
        track.end_group()
        track.close()
        conn.send("published")
    await publisher.close()


def _publisher_process(pki: str, relay_uri: str, blocks: int, conn: Connection) -> None:
    asyncio.run(_publisher_main(Path(pki), relay_uri, blocks, conn))


# -- measurements (this process) -------------------------------------------------------------------------
class Bench:
    def __init__(self, relay: Connection, publisher: Connection, subscribers: list[Subscriber],
                 direct: Subscriber) -> None:
        self.relay, self.publisher = relay, publisher
        self.subscribers, self.direct = subscribers, direct
        self.tracks = 0

    async def ask(self, conn: Connection, command: object) -> object:
        conn.send(command)
        return await asyncio.to_thread(conn.recv)

    async def fanout_once(self, n: int, octets: int) -> tuple[float, float]:
        """Seconds until n subscribers have the whole live track; upstream octets / track octets."""
        self.tracks += 1
        name = f"t{self.tracks}"
        await self.ask(self.relay, "reset")
        await self.ask(self.publisher, ("open", name, 0))

        async def receive(sub: Subscriber) -> int:
            async with sub.subscribe(live_ns(name), TRACK, end_group=0, timeout_s=120) as objects:
                return sum([obj.payload.nbytes async for obj in objects])

        tasks = [asyncio.create_task(receive(sub)) for sub in self.subscribers[:n]]
        while True:
            stats = await self.ask(self.relay, "stats")
            assert isinstance(stats, dict)
            if stats["subscribers"] >= n:
                break
            for task in tasks:
                if task.done():
                    task.result()  # a subscription failed: raise its error
            await asyncio.sleep(0.01)
        start = time.perf_counter()
        self.publisher.send(("publish", name, octets))
        received = await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
        await asyncio.to_thread(self.publisher.recv)
        assert received == [octets // OBJECT * OBJECT] * n, received
        stats = await self.ask(self.relay, "stats")
        assert isinstance(stats, dict)
        return elapsed, stats["bytes_in"] / (octets // OBJECT * OBJECT)

    @staticmethod
    async def fetch(sub: Subscriber, block: int) -> tuple[float, float]:
        """(first object, whole block) seconds."""
        start = time.perf_counter()
        first = 0.0
        count = 0
        async with sub.fetch(block_ns(block), TRACK, Location(0, 0), Location(0, LAYERS)) as objects:
            async for _ in objects:
                count += 1
                if count == 1:
                    first = time.perf_counter() - start
        assert count == LAYERS
        return first, time.perf_counter() - start


async def _fanout_rows(bench: Bench, octets: int, reps: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    aggregate: dict[int, float] = {}
    for n in (1, 4, 16):
        await bench.fanout_once(n, octets)  # warm-up
        runs = [await bench.fanout_once(n, octets) for _ in range(reps)]
        sample = Sample.of([t for t, _ in runs])
        aggregate[n] = n * octets / sample.median_s / 1e6
        row = case(f"fanout_1_to_{n}", sample, None, "upstream octets 1x the track (upstream_ratio == 1.0)")
        row["upstream_ratio"] = max(ratio for _, ratio in runs)
        row["aggregate_mb_per_s"] = round(aggregate[n], 1)
        add_check(row, "upstream_ratio", "<=", 1.0)
        rows.append(row)
    row = case("fanout_aggregate_16_vs_1", aggregate[16], aggregate[1], "aggregate throughput at 16 >= 0.8x at 1",
               unit="MB/s", goal_min_ratio=0.8)
    rows.append(row)
    return rows


async def _fetch_rows(bench: Bench, reps: int) -> list[dict[str, object]]:
    via = bench.subscribers[0]
    times: dict[str, list[float]] = {k: [] for k in ("hit_first", "hit_all", "miss_all", "direct_first",
                                                      "direct_all", "relay_first", "relay_all")}
    block = 0
    for rep in range(reps + 1):
        _, miss = await bench.fetch(via, block)  # never fetched: relay -> publisher
        hit_first, hit = await bench.fetch(via, block)   # now cached at the relay
        first_d, all_d = await bench.fetch(bench.direct, block + 1)
        first_r, all_r = await bench.fetch(via, block + 1)  # a miss too, alternating with direct
        block += 2
        if rep:  # the first round warms up
            for key, value in (("miss_all", miss), ("hit_first", hit_first), ("hit_all", hit),
                               ("direct_first", first_d), ("direct_all", all_d), ("relay_first", first_r),
                               ("relay_all", all_r)):
                times[key].append(value)
    t = {key: Sample.of(values) for key, values in times.items()}
    block_octets = LAYERS * OBJECT
    rows = [
        case("fetch_cache_hit_vs_miss", t["hit_all"], t["miss_all"], "hit <= 1.0x miss latency",
             goal_max_ratio=1.0),
        case("relay_hop_first_object", t["relay_first"], t["direct_first"],
             "via relay (miss) <= 1.3x direct first-object latency", goal_max_ratio=1.3),
        case("relay_hop_block", t["relay_all"], t["direct_all"],
             "via relay (miss) >= 0.8x direct throughput (ratio = direct time / relay time)",
             higher_is_better=True, goal_min_ratio=0.8),
        case("relay_hit_first_object", t["hit_first"], t["direct_first"],
             "via relay (cache hit) vs direct first-object latency (no goal: what a rack-local reader sees)"),
        case("relay_hit_block", t["hit_all"], t["direct_all"],
             "via relay (cache hit) vs direct throughput (no goal; ratio = direct time / relay time)",
             higher_is_better=True),
    ]
    for row, key in ((rows[2], "relay_all"), (rows[4], "hit_all")):
        row["mb_per_s"] = {"relay": round(block_octets / t[key].median_s / 1e6, 1),
                           "direct": round(block_octets / t["direct_all"].median_s / 1e6, 1)}
    return rows


async def _cpu_rows(bench: Bench, first_block: int, count: int) -> list[dict[str, object]]:
    """CPU seconds per block, all processes together: direct (publisher + subscriber) against a miss
    (publisher + relay + subscriber). When the cores are the bottleneck, the relay's throughput ratio
    cannot exceed the inverse of this ratio."""
    async def cpu() -> tuple[float, float, float]:
        relay, publisher = await bench.ask(bench.relay, "cpu"), await bench.ask(bench.publisher, "cpu")
        assert isinstance(relay, float) and isinstance(publisher, float)
        return relay, publisher, time.process_time()

    per_block: dict[str, tuple[float, float, float]] = {}
    for name, sub, start in (("direct", bench.direct, first_block), ("miss", bench.subscribers[0], first_block)):
        before = await cpu()
        for block in range(start, start + count):
            await bench.fetch(sub, block)  # the same blocks: first direct, then through the relay (misses)
        after = await cpu()
        per_block[name] = ((after[0] - before[0]) / count, (after[1] - before[1]) / count,
                           (after[2] - before[2]) / count)
    direct, miss = (sum(per_block[k]) for k in ("direct", "miss"))
    row = case("cpu_per_block_miss_vs_direct", miss, direct, "CPU of all processes per block, via relay (miss) vs "
               "direct (no goal: bounds relay_hop_block when the cores are saturated)", unit="cpu_s")
    row["cpu_ms"] = {name: {"relay": round(r * 1e3, 2), "publisher": round(p * 1e3, 2), "subscriber": round(c * 1e3, 2)}
                     for name, (r, p, c) in per_block.items()}
    return [row]


async def _chain_rows(bench: Bench, chain: Subscriber, rack: Connection, first_block: int,
                      reps: int) -> list[dict[str, object]]:
    """Through two relays (rack -> spine -> publisher) against one relay and against direct."""
    times: dict[str, list[float]] = {k: [] for k in ("chain_miss", "one_miss", "chain_hit", "direct")}
    hit_upstream = 0
    block = first_block
    for rep in range(reps + 1):
        _, chain_miss = await bench.fetch(chain, block)  # misses at the rack relay and at the spine
        before = await bench.ask(rack, "stats")
        _, chain_hit = await bench.fetch(chain, block)  # the rack relay's cache
        after = await bench.ask(rack, "stats")
        assert isinstance(before, dict) and isinstance(after, dict)
        hit_upstream += after["upstream_fetches"] - before["upstream_fetches"]
        _, one_miss = await bench.fetch(bench.subscribers[0], block + 1)  # a miss through the spine alone
        _, direct = await bench.fetch(bench.direct, block + 1)
        block += 2
        if rep:  # the first round warms up
            for key, value in (("chain_miss", chain_miss), ("one_miss", one_miss), ("chain_hit", chain_hit),
                               ("direct", direct)):
                times[key].append(value)
    t = {key: Sample.of(values) for key, values in times.items()}
    upstream = case("chain_upstream_fetches", float(hit_upstream), None,
                    "a repeated FETCH at the rack relay sends nothing upstream (upstream_fetches == 0)", unit="count")
    upstream["upstream_fetches"] = hit_upstream
    add_check(upstream, "upstream_fetches", "<=", 0)
    return [
        case("chain_miss_vs_one_relay", t["chain_miss"], t["one_miss"],
             "two relays (miss at both) vs one relay (miss): the cost of the second hop (no goal)"),
        case("chain_hit_vs_direct", t["chain_hit"], t["direct"],
             "rack relay cache hit behind a spine vs direct from the publisher (no goal; ratio = direct / chain)",
             higher_is_better=True),
        upstream,
    ]


async def _profile_misses(bench: Bench, path: str, first_block: int, count: int) -> None:
    """cProfile of the relay process over ``count`` FETCH misses (nothing else runs meanwhile)."""
    await bench.ask(bench.relay, "profile")
    for block in range(first_block, first_block + count):
        await bench.fetch(bench.subscribers[0], block)
    await bench.ask(bench.relay, ("profile_dump", path))


async def _measure(pki: Path, ports: tuple[int, int, int], relay: Connection, publisher: Connection,
                   rack: Connection, options: Options) -> list[dict[str, object]]:
    relay_port, publisher_port, rack_port = ports
    config = _config(pki, "subscriber", BLOCK_CLIENT_QUIC)  # as the block client reads blocks
    relay_uri = f"moqt://127.0.0.1:{relay_port}/relay"
    subscribers = [await Subscriber.connect(relay_uri, config, timeout_s=120) for _ in range(16)]
    direct = await Subscriber.connect(f"moqt://127.0.0.1:{publisher_port}/", config, timeout_s=120)
    chain = await Subscriber.connect(f"moqt://127.0.0.1:{rack_port}/relay2", config, timeout_s=120)
    bench = Bench(relay, publisher, subscribers, direct)
    try:
        rows = [] if options.fetch_only else await _fanout_rows(bench, options.octets, options.reps)
        rows += await _fetch_rows(bench, options.reps)
        rows += await _cpu_rows(bench, 2 * (options.reps + 1), CPU_BLOCKS)
        chain_first = 2 * (options.reps + 1) + CPU_BLOCKS
        rows += await _chain_rows(bench, chain, rack, chain_first, options.reps)
        if options.profile is not None:
            await _profile_misses(bench, options.profile, chain_first + 2 * (options.reps + 1), PROFILED_MISSES)
        stats = await bench.ask(relay, "stats")
        assert isinstance(stats, dict)
        hop = next(row for row in rows if row["case"] == "relay_hop_block")
        hop["relay_cut_through_objects"] = stats["cut_through"]  # objects passed on piece by piece
        return rows
    finally:
        for sub in [*subscribers, direct, chain]:
            await sub.close()


@dataclass(frozen=True, slots=True)
class Options:
    octets: int = 16 * MiB
    reps: int = 5
    fetch_only: bool = False  # skip the fan-out cases
    profile: str | None = None  # write a cProfile of the relay over PROFILED_MISSES misses here
    relay_quic: QuicSettings = RELAY_QUIC

    @classmethod
    def parse(cls, argv: Sequence[str]) -> Options:
        quick = "--quick" in argv
        profile = argv[argv.index("--profile") + 1] if "--profile" in argv else None
        quic = RELAY_QUIC
        if "--relay-ack-delay" in argv:
            quic = dataclasses.replace(quic, ack_delay_s=float(argv[argv.index("--relay-ack-delay") + 1]))
        if "--relay-recv-batch" in argv:
            quic = dataclasses.replace(quic, recv_batch=int(argv[argv.index("--relay-recv-batch") + 1]))
        return cls(4 * MiB if quick else 16 * MiB, 2 if quick else 5, "--fetch-only" in argv, profile, quic)


def run(quick: bool = False, options: Options | None = None) -> dict[str, object]:
    options = options or (Options(4 * MiB, 2) if quick else Options())
    with tempfile.TemporaryDirectory() as tmp:
        pki = Path(tmp)
        make_dev_pki(pki, [RoleSpec(name, uri) for name, uri in ROLES.items()])
        ctx = mp.get_context("spawn")
        relay_conn, relay_child = ctx.Pipe()
        pub_conn, pub_child = ctx.Pipe()
        relay = ctx.Process(target=_relay_process, args=(tmp, relay_child, options.relay_quic), daemon=True)
        relay.start()
        publisher: mp.process.BaseProcess | None = None
        blocks = 4 * (options.reps + 1) + CPU_BLOCKS + (PROFILED_MISSES if options.profile else 0)
        rack_conn, rack_child = ctx.Pipe()
        rack: mp.process.BaseProcess | None = None
        try:
            relay_port: int = relay_conn.recv()
            rack = ctx.Process(target=_relay_process, daemon=True, args=(
                tmp, rack_child, options.relay_quic, "relay2", (f"moqt://127.0.0.1:{relay_port}/relay",)))
            rack.start()
            rack_port: int = rack_conn.recv()
            publisher = ctx.Process(target=_publisher_process, daemon=True,
                                    args=(tmp, f"moqt://127.0.0.1:{relay_port}/relay", blocks, pub_child))
            publisher.start()
            publisher_port: int = pub_conn.recv()
            rows = asyncio.run(_measure(pki, (relay_port, publisher_port, rack_port), relay_conn, pub_conn, rack_conn,
                                        options))
        finally:
            for conn in (pub_conn, rack_conn, relay_conn):
                conn.send("stop")
            for proc in (publisher, rack, relay):
                if proc is not None:
                    proc.join(10)
                    if proc.is_alive():
                        proc.terminate()
    return {"name": "relay", "params": {"fanout_track_octets": options.octets, "block_octets": LAYERS * OBJECT,
                                        "object_octets": OBJECT, "reps": options.reps,
                                        "relay_ack_delay_s": options.relay_quic.ack_delay_s,
                                        "relay_recv_batch": options.relay_quic.recv_batch,
                                        "processes": "relay, publisher and subscribers in separate processes"},
            "cases": rows}


def main(argv: Sequence[str]) -> None:
    """``[--quick] [--fetch-only] [--profile FILE] [--relay-ack-delay SECONDS] [--relay-recv-batch N]``."""
    print(json.dumps(run(options=Options.parse(argv)), indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
