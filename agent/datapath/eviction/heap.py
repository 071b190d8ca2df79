"""Leaf ranking by a static priority kept in a binary heap with lazy deletion (LRU, Belady).

A block's priority is fixed at its latest access (``_priority``); the heap holds one live entry per attached
leaf plus stale entries that are dropped when they reach the top. O(log n) per access and per victim; the heap
is rebuilt from the live leaves when stale entries outnumber them (amortised O(1) per push).
"""

from __future__ import annotations

import heapq
from abc import abstractmethod
from collections.abc import Iterable
from typing import Any

from agent.datapath.eviction.base import EvictionPolicy, PlanState
from agent.datapath.eviction.tree import Block


class HeapLeafPolicy(EvictionPolicy):
    """Evicts the attached leaf with the smallest ``_priority`` tuple first (ties cannot happen: the tuple
    ends with a unique touch sequence number)."""

    def __init__(self) -> None:
        super().__init__()
        self._heap: list[tuple[Any, int, Block]] = []
        self._leaves = 0
        self._seq = 0

    @abstractmethod
    def _priority(self, node: Block, seq: int) -> tuple:
        """Priority of ``node`` fixed at its latest access; ``seq`` increases with every access."""

    def _push(self, node: Block) -> None:
        node.ver += 1
        heapq.heappush(self._heap, (node.prio, node.ver, node))
        if len(self._heap) > 2 * self._leaves + 1024:
            self._rebuild()

    def _rebuild(self) -> None:
        self._heap = [
            (b.prio, b.ver, b) for b in self.tree.blocks() if b.attached and not b.children
        ]
        heapq.heapify(self._heap)

    def _leaf_added(self, node: Block) -> None:
        self._leaves += 1
        if node.prio is None:
            self._seq += 1
            node.prio = self._priority(node, self._seq)
        self._push(node)

    def _leaf_removed(self, node: Block) -> None:
        self._leaves -= 1
        node.ver += 1

    def _touched(self, node: Block, now: float, inserted: bool) -> None:
        if inserted and node.prio is not None:
            return  # ranked by _leaf_added during the insert
        self._seq += 1
        node.prio = self._priority(node, self._seq)
        if node.attached and not node.children:
            self._push(node)

    def _plan(self, need: int, now: float) -> Iterable[Block]:
        heap = self._heap
        state = PlanState()
        virtual: list[tuple[Any, int, Block]] = []
        restore: list[tuple[tuple, int, Block]] = []
        out: list[Block] = []
        try:
            while need > 0:
                while heap:
                    prio, ver, node = heap[0]
                    if ver == node.ver and node.attached and not node.children:
                        break
                    heapq.heappop(heap)
                if heap and (not virtual or heap[0][0] < virtual[0][0]):
                    entry = heapq.heappop(heap)
                    restore.append(entry)
                    node = entry[2]
                elif virtual:
                    node = heapq.heappop(virtual)[2]
                else:
                    break
                out.append(node)
                need -= node.size
                parent = state.plan(node)
                if parent is not None:
                    heapq.heappush(virtual, (parent.prio, parent.ver, parent))
        finally:
            for entry in restore:
                heapq.heappush(heap, entry)
        return out
