"""Layer-wise prefill: loading the cached prefix while it is computed on, and publishing while computing.

Why: the container (section 4.3) and the MOQT binding (decision D3) put layers in ascending order so
that an engine can compute layer l of a prompt as soon as layer l of every cached block is in, while
layers l+1.. are still on the wire; and so that a producer can hand layer l of a new block to its
consumers before layer l+1 exists.  The engine side is `kvsp.engine.LayerwiseEngine`:
``prefill_layerwise(tokens, prefix_blocks, wait_layer, on_layer)`` runs in a worker thread, calls
``wait_layer(l)`` before layer l and ``on_layer(l)`` after it.

* `LayerGate` is what ``wait_layer`` waits on: the fetch (in the event loop) reports each layer it gave
  to ``import_kv``; a block that cannot be loaded (every replica failed, the load deadline passed) or
  the end of the session fails the gate, and ``wait_layer`` raises `LoadAborted` in the engine thread,
  whose caller then recomputes from the first block not loaded (a plain prefill of the loaded prefix).
* `LiveBlocks` publishes the computed blocks of a prefill as MOQT objects on the holder's listener
  (`kvsp.moqt_binding.LiveBlockPublisher`): ``on_layer(l)`` exports layer l of every computed block in
  the engine thread and hands the objects to the event loop, so a subscriber has layer l while the
  engine computes l+1.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Final

from kvsp.engine import Engine, LayerwiseEngine
from kvsp.errors import KvspError
from kvsp.identifiers import TrackNamespace
from kvsp.moqt_binding import LiveBlockPublisher
from moqt.api import Publisher
from moqt.kinds import PublishDoneStatus

WAIT_MARGIN_S: Final = 5.0  # beyond the load deadline, wait_layer gives up on its own (never a stuck thread)


class LoadAborted(KvspError):
    """Raised in the engine thread by ``wait_layer``: the prefix will not be complete; recompute instead."""


def layerwise(engine: Engine) -> LayerwiseEngine | None:
    """The engine as a `LayerwiseEngine` when it implements ``prefill_layerwise``, else None."""
    if callable(getattr(engine, "prefill_layerwise", None)):
        return engine  # type: ignore[return-value]  # structural: the method exists
    return None


class LayerGate:
    """Which layers of the ``blocks`` prefix blocks are in the engine (thread-safe; see the module)."""

    def __init__(self, blocks: int, layers: int, *, timeout_s: float) -> None:
        self.blocks = blocks
        self.layers = layers
        self.timeout_s = timeout_s
        self._ready = [0] * blocks  # layers given to import_kv, per block (ascending, so a count)
        self._lowest = 0 if blocks else layers  # min(_ready): layers complete in every block
        self._failed: str | None = None
        self._cond = threading.Condition()

    @property
    def complete(self) -> bool:
        return self._lowest >= self.layers

    @property
    def failed(self) -> str | None:
        return self._failed

    def imported(self, block: int, layer: int) -> None:
        """Layer ``layer`` of block ``block`` was given to ``import_kv`` (layers of a block ascend)."""
        if not 0 <= block < self.blocks:
            return
        with self._cond:
            self._ready[block] = max(self._ready[block], layer + 1)
            lowest = min(self._ready)
            if lowest != self._lowest:
                self._lowest = lowest
                self._cond.notify_all()

    def imported_all(self, block: int) -> None:
        self.imported(block, self.layers - 1)

    def fail(self, reason: str) -> None:
        """The prefix will not complete: every waiter (now and later) raises `LoadAborted`."""
        with self._cond:
            if self._failed is None and not self.complete:
                self._failed = reason
            self._cond.notify_all()

    def wait_layer(self, layer: int) -> None:
        """Until layer ``layer`` of every prefix block is in (engine thread); `LoadAborted` otherwise."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._lowest > layer or self._failed is not None, self.timeout_s):
                self._failed = self._failed or f"layer {layer} of the prefix did not arrive in {self.timeout_s} s"
            if self._lowest > layer:
                return
            raise LoadAborted(self._failed or "aborted")


class LiveBlocks:
    """Live MOQT tracks of the blocks a prefill computes, fed layer by layer (see the module)."""

    def __init__(self, publisher: Publisher, namespaces: Sequence[TrackNamespace], *, first_block: int,
                 engine: Engine, loop: asyncio.AbstractEventLoop, layers: int) -> None:
        """Call in the event loop; ``namespaces[i]`` is block ``first_block + i`` of the context."""
        self.engine = engine
        self.loop = loop
        self.layers = layers
        self.first_block = first_block
        self.producers = [LiveBlockPublisher(publisher, namespace) for namespace in namespaces]
        self.published = 0  # layers handed out so far

    def on_layer(self, layer: int) -> None:
        """Engine thread: export layer ``layer`` of every computed block, publish it in the loop."""
        payloads = []
        for i in range(len(self.producers)):
            (section,) = self.engine.export_kv(self.first_block + i, (layer, layer))
            payloads.append(b"".join((section.k, section.v)))  # one object: K then V (the layer digest input)
        self.loop.call_soon_threadsafe(self._publish, layer, payloads)

    def _publish(self, layer: int, payloads: list[bytes]) -> None:
        for producer, payload in zip(self.producers, payloads, strict=True):
            producer.publish_layer(layer, payload)
            if layer == self.layers - 1:
                producer.finish()
        self.published = layer + 1

    def abort(self) -> None:
        """Event loop: the prefill failed; subscribers of unfinished blocks get PUBLISH_DONE with an error."""
        if self.published < self.layers:
            for producer in self.producers:
                producer.abort(PublishDoneStatus.INTERNAL_ERROR)
