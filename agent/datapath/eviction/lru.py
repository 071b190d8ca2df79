"""LRU baselines: leaf-restricted LRU (no orphans) and plain LRU (ignores the prefix tree).

- :class:`LeafLRUPolicy` evicts the least recently used *leaf*; this is the order SGLang's radix cache uses
  on GPU memory, and it never orphans a block.
- :class:`PlainLRUPolicy` evicts the least recently used *block*, whatever its children, as a store that knows
  no prefixes does (Mooncake's master evicts by lease and allocation order, not by prefix). Its victims can
  orphan blocks; it is here only as a reference point for the simulator.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable

from agent.datapath.eviction.base import EvictionPolicy
from agent.datapath.eviction.heap import HeapLeafPolicy
from agent.datapath.eviction.tree import Block

Key = Hashable


class LeafLRUPolicy(HeapLeafPolicy):
    """Least recently used attached leaf first; ties (same time) in touch order. O(log n) per call."""

    name = "lru"

    def _priority(self, node: Block, seq: int) -> tuple:
        return (node.last, seq)


class PlainLRUPolicy(EvictionPolicy):
    """Least recently touched block first, leaf or not (may orphan blocks; baseline only).

    :meth:`select_victims` returns blocks in LRU order without regard to the tree or to orphans, so it
    does not keep the base-class promise of leaf-first plans. O(1) per call (ordered dict).
    """

    name = "plain-lru"

    def __init__(self) -> None:
        super().__init__()
        self._order: OrderedDict[Key, Block] = OrderedDict()

    def _touched(self, node: Block, now: float, inserted: bool) -> None:
        if inserted:
            self._order[node.key] = node
        else:
            self._order.move_to_end(node.key)

    def _removing(self, node: Block) -> None:
        del self._order[node.key]

    def select_victims(self, bytes_to_free: int, now: float | None = None) -> list[Key]:
        """Least recently touched blocks first (orphans get no precedence) until their sizes reach
        ``bytes_to_free``."""
        if now is not None:
            self._clock(now)
        return [node.key for node in self._plan(bytes_to_free, self.now)]

    def _plan(self, need: int, now: float) -> Iterable[Block]:
        out: list[Block] = []
        for node in self._order.values():
            if need <= 0:
                break
            out.append(node)
            need -= node.size
        return out
