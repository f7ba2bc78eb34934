"""The scheduler side's bookkeeping, sans-I/O: which tokens a request loads, which blocks it stores.

vLLM asks `get_num_new_matched_tokens` once per scheduling attempt; the connector's answer comes from a
lookup that runs on its background loop, so the first calls answer "not yet" (``None``) and the
scheduler loop never waits on the network.  When the lookup is in, ``matched`` leading Block Keys have a
replica (section 6.2: the IS stops at the first key without one); only blocks that end before the
prompt's last token are loadable, since vLLM computes at least that token.  The metadata the workers get
is plain frozen data: ids, block ids, token counts and the replica records as their JSON octets.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """Load KVSP blocks ``first_block .. first_block+len(replicas)-1`` of one request into vLLM blocks.

    Tokens below ``skip_tokens`` are vLLM's own (its prefix cache) and are not overwritten.
    ``block_ids`` are the request's vLLM block ids from token 0 on.
    """

    req_id: str
    scope_id: bytes
    compat_id: bytes
    first_block: int
    replicas: tuple[tuple[bytes, ...], ...]  # per KVSP block, the replica records' JSON octets
    skip_tokens: int
    block_ids: tuple[int, ...]


def end_of(spec: LoadSpec, block_tokens: int) -> int:
    return (spec.first_block + len(spec.replicas)) * block_tokens


@dataclass(frozen=True, slots=True)
class StoreSpec:
    """Store KVSP blocks ``first_block ..`` (their keys) of one request, computed in this step."""

    req_id: str
    scope_id: bytes
    compat_id: bytes
    first_block: int
    block_keys: tuple[bytes, ...]
    block_ids: tuple[int, ...]  # the request's vLLM block ids from token 0 on


@dataclass(frozen=True, slots=True)
class StepPlan:
    loads: tuple[LoadSpec, ...] = ()
    stores: tuple[StoreSpec, ...] = ()


def loadable_blocks(prompt_tokens: int, block_tokens: int) -> int:
    """Complete blocks that end before the prompt's last token (vLLM always computes that one)."""
    return max(0, (prompt_tokens - 1) // block_tokens)


def external_tokens(matched: int, prompt_tokens: int, local_tokens: int, block_tokens: int) -> int:
    """Tokens the connector loads beyond vLLM's ``local_tokens``: matched loadable blocks' end, minus those."""
    end = min(matched, loadable_blocks(prompt_tokens, block_tokens)) * block_tokens
    return max(0, end - local_tokens)


@dataclass(slots=True)
class RequestState:
    """One request as the scheduler side follows it."""

    req_id: str
    prompt_tokens: int
    scope_id: bytes | None  # None: no scope (no lookup, no store)
    block_keys: tuple[bytes, ...] = ()  # every complete block of the prompt
    matched: int | None = None  # None while the lookup runs
    replicas: tuple[tuple[bytes, ...], ...] = ()
    local_tokens: int = 0
    external: int = 0
    block_ids: list[int] = field(default_factory=list)
    computed: int = 0  # prompt tokens computed or loaded by the end of the last scheduled step
    stored: bool = False
    load_sent: bool = False

    def plan_load(self, compat_id: bytes, block_tokens: int) -> LoadSpec | None:
        if self.external <= 0 or self.load_sent or self.scope_id is None:
            return None
        self.load_sent = True
        first = self.local_tokens // block_tokens
        last = (self.local_tokens + self.external) // block_tokens
        return LoadSpec(self.req_id, self.scope_id, compat_id, first, self.replicas[first:last],
                        self.local_tokens, tuple(self.block_ids))

    def plan_store(self, compat_id: bytes, scheduled: int) -> StoreSpec | None:
        """After this step computes ``scheduled`` more tokens: store once the whole prompt is computed."""
        self.computed += scheduled
        if self.stored or self.scope_id is None or self.computed < self.prompt_tokens:
            return None
        self.stored = True
        first = self.matched or 0  # the IS already knows a replica of every matched block
        if first >= len(self.block_keys):
            return None
        return StoreSpec(self.req_id, self.scope_id, compat_id, first, self.block_keys[first:],
                         tuple(self.block_ids))
