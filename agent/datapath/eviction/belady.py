"""Offline optimum for prefix caches: Belady's MIN restricted to leaves (needs the future; simulator only).

Evicts the attached leaf whose next use is farthest in the future. Any request that uses a block also uses
all its ancestors, so a parent's next use is never later than a child's: the farthest-used block can always
be taken from among the leaves, and leaf-first MIN is as good as unrestricted MIN while orphaning nothing.
Ties (for example blocks never used again) go to the deeper block, then to the older access.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from agent.datapath.eviction.heap import HeapLeafPolicy
from agent.datapath.eviction.tree import Block

Key = Hashable


class BeladyPolicy(HeapLeafPolicy):
    """Farthest next use first. ``next_use(key)`` returns when the block is next used after the current
    access, in any increasing unit (request index or seconds), ``math.inf`` for never; it is read when the
    block is inserted or accessed. O(log n) per call."""

    name = "belady"

    def __init__(self, next_use: Callable[[Key], float]) -> None:
        super().__init__()
        self._next_use = next_use

    def _priority(self, node: Block, seq: int) -> tuple:
        return (-self._next_use(node.key), -node.depth, seq)
