"""A shadow leaf-LRU cache over keys only, to measure what LRU would hit at the same occupancy.

It keeps one ordered-dict entry per block (key -> size) and no tree: touching a request's blocks from the
deepest to the root makes every block more recent than its descendants, so the least recent entry is always
a leaf and popping from the front is leaf-first LRU. O(1) per block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

Key = Hashable


class ShadowLRU:
    """Leaf-first LRU replayed on the same block calls as a real policy, trimmed to the same occupancy.

    Feed it each block of a request in prefix order with :meth:`record`; a block whose parent is not the
    previous block starts a new request. :attr:`hits` counts prefix-hit blocks (leading blocks present when
    the request was replayed); :attr:`bytes` the bytes it holds.
    """

    def __init__(self) -> None:
        self._order: OrderedDict[Key, int] = OrderedDict()
        self._request: list[tuple[Key, int]] = []
        self.bytes = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key: object) -> bool:
        return key in self._order

    def record(self, key: Key, parent: Key | None, size: int) -> None:
        """One block of a request (root first); ``size`` in bytes."""
        if self._request and parent != self._request[-1][0]:
            self.flush()
        self._request.append((key, size))

    def flush(self) -> int:
        """Replay the buffered request: count its prefix hit, then touch its blocks deepest first.
        Returns the prefix hit in blocks."""
        request = self._request
        if not request:
            return 0
        order = self._order
        hit = 0
        for key, _ in request:
            if key not in order:
                break
            hit += 1
        for key, size in reversed(request):
            if key in order:
                order.move_to_end(key)
            else:
                order[key] = size
                self.bytes += size
        self._request = []
        self.hits += hit
        return hit

    def trim(self, target_bytes: int) -> None:
        """Evict least recently used blocks (leaves first) until at most ``target_bytes`` remain."""
        self.flush()
        order = self._order
        while self.bytes > target_bytes and order:
            _, size = order.popitem(last=False)
            self.bytes -= size
