"""A prefetch directive that misses its deadline, between real processes (spec section 6.5).

The prompt's 256 blocks are cached at the cache holder only (stored there by the front end, published
to the IS).  The instances report a link to it (``[instance] links``), so the PC prices loading against
recomputing (section 6.4), finds loading cheaper (the test engine is slowed to 1 ms per prefilled
token) and sends the chosen instance a directive whose deadline is twice the estimated fetch time.
The link is reported slow enough that the deadline is about 300 ms, while loading one block at a time
(a lease, a GET, digests, placing: milliseconds each) takes longer than that for 256 blocks: the
directive ends "partial" with a loaded prefix, the start of the session (which waited for its
directive instead of fetching alongside it) takes that prefix from the instance's own tiers,
recomputes the remainder, and the output is exactly the engine's.
"""

from __future__ import annotations

from pathlib import Path

from control.deploy.system import FrontEnd, Settings, reference_tokens, running_system
from kvsp.client.holder import HolderClient, StoreOutcome
from kvsp.engine import greedy_sampler
from tests.support.instance import COMPAT, SCOPE, B, keys_of, reference_block

BLOCKS = 256
PROMPT = tuple(range(3000, 3000 + BLOCKS * B + 3))  # 256 blocks and a tail of 3
ESTIMATED_FETCH_US = 150_000  # the directive's deadline is twice this


async def test_prefetch_deadline_gives_a_partial_prefix_and_the_rest_is_recomputed(tmp_path: Path) -> None:
    block_octets = len(reference_block(PROMPT, 0))
    link = 8 * block_octets * BLOCKS / ESTIMATED_FETCH_US  # Mbit/s: 256 blocks in ~150 ms as priced
    settings = Settings(instance={"test_prefill_us_per_token": 1000, "prefetch_concurrency": 1},
                        link_mbit_per_s=link)
    async with running_system(tmp_path, settings) as system:
        keys = keys_of(PROMPT)
        assert len(keys) == BLOCKS
        async with system.pki.session("fe") as session:
            holder = HolderClient(session)
            for i, key in enumerate(keys):
                stored = await holder.put_block(system.uri("h1"), COMPAT, SCOPE, key, reference_block(PROMPT, i))
                assert stored is StoreOutcome.STORED

        async def published() -> bool:
            return await system.metric("pc", "kvsp_is_replicas") >= BLOCKS
        await system.wait_for(published, "the blocks published by the cache holder")

        fe = FrontEnd(system)
        sampler = greedy_sampler()
        info = await fe.generate(PROMPT, 8, sampler)
        out = await fe.receive(info, timeout_s=30)
        assert out.tokens == reference_tokens(PROMPT, 8, sampler)

        pc = await system.metrics("pc")
        assert pc["kvsp_pc_cache_placements_total"] == 1
        assert pc['kvsp_pc_prefetches_sent_total{result="accepted"}'] == 1
        owner = system.name_of(info.instance)
        assert owner is not None
        ii = await system.metrics(owner)
        assert ii['kvsp_instance_prefetches_total{state="partial"}'] == 1
        prefix = ii["kvsp_instance_prefetch_blocks_total"]
        local = ii['kvsp_instance_tokens_fetched_total{source="local"}']
        recomputed = ii["kvsp_instance_tokens_recomputed_total"]
        assert 0 < prefix < BLOCKS, (prefix, ii)
        # The session used what the directive placed (a block whose load was already being stored at the
        # deadline may still land, so at least the prefix), fetched nothing more, recomputed the rest.
        assert local >= prefix * B
        assert ii['kvsp_instance_tokens_fetched_total{source="remote"}'] == 0
        assert local + recomputed == len(PROMPT) and recomputed >= B
        print(f"prefetch: {int(prefix)} of {BLOCKS} blocks by the deadline; {int(local)} tokens loaded, "
              f"{int(recomputed)} recomputed")
