"""The workload of ``kvsp up`` / ``kvsp workload``, as data (sans-I/O): chats that share context.

- a few **system prompts** shared by every chat of a tenant (the most common cached prefix);
- **documents** shared across chats (RAG style: the same retrieved document in several prompts);
- **multi-turn chats**: turn k's prompt is turn k-1's prompt, its answer and a new question, so each
  turn extends a prefix the previous turn cached (the generated blocks included);
- two **tenants** with separate scopes: the same document in two tenants is cached twice, never shared.

A prompt is built as token ids (the tokenizer's encoding of each text part, and a turn's answer as the
ids the model produced), so a chat's next turn extends exactly the token sequence that was cached.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

WORDS: Final = (
    "cache", "block", "layer", "token", "prefix", "scope", "holder", "relay", "index", "lease", "epoch",
    "session", "instance", "placement", "digest", "replica", "tier", "storage", "attention", "key", "value",
    "model", "prompt", "request", "policy", "tenant", "document", "answer", "question", "system", "stream",
    "the", "a", "of", "to", "and", "in", "is", "for", "with", "on", "that", "by", "from", "as", "at",
)


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    chats: int = 12
    turns: int = 3
    system_prompts: int = 2
    documents: int = 4
    tenants: tuple[str, ...] = ("public", "acme")
    max_tokens: int = 24
    concurrency: int = 4
    seed: int = 0
    system_words: int = 60
    document_words: int = 120
    question_words: int = 12
    rag_fraction: float = 0.5  # chats that carry a shared document
    kill_after: float | None = 0.3  # SIGKILL an instance once this fraction of requests completed (None: never)
    stagger_s: float = 0.2  # worker k starts k x this late: arrivals spread out, as in real traffic

    @property
    def requests(self) -> int:
        return self.chats * self.turns


@dataclass(frozen=True, slots=True)
class Chat:
    name: str
    tenant: str
    system: str
    document: str | None
    questions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Workload:
    spec: WorkloadSpec
    chats: tuple[Chat, ...]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def build(spec: WorkloadSpec) -> Workload:
    """The chats of ``spec`` (a function of the spec alone: the same seed gives the same workload)."""
    rng = random.Random(spec.seed)
    systems = [f"System: you are assistant {i}. {_text(rng, spec.system_words)}\n" for i in range(spec.system_prompts)]
    documents = [f"Document {i}: {_text(rng, spec.document_words)}\n" for i in range(spec.documents)]
    chats = []
    for c in range(spec.chats):
        tenant = spec.tenants[c % len(spec.tenants)]
        document = rng.choice(documents) if documents and rng.random() < spec.rag_fraction else None
        questions = tuple(f"User: {_text(rng, spec.question_words)}\nAssistant:" for _ in range(spec.turns))
        chats.append(Chat(f"chat-{c:03d}", tenant, systems[c % len(systems)], document, questions))
    return Workload(spec, tuple(chats))


@dataclass
class Conversation:
    """One chat's token history, extended turn by turn with the answers received."""

    chat: Chat
    encode: Callable[[str], list[int]]
    history: list[int] = field(default_factory=list)
    turn: int = 0

    def __post_init__(self) -> None:
        self.history = self.encode(self.chat.system) + (self.encode(self.chat.document) if self.chat.document else [])

    @property
    def done(self) -> bool:
        return self.turn >= len(self.chat.questions)

    @property
    def request_id(self) -> str:
        return f"{self.chat.name}/turn-{self.turn}"

    def next_prompt(self) -> list[int]:
        return self.history + self.encode(self.chat.questions[self.turn])

    def answered(self, prompt: Sequence[int], answer: Sequence[int], newline: Sequence[int]) -> None:
        self.history = [*prompt, *answer, *newline]
        self.turn += 1


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)
