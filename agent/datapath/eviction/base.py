"""The interface every eviction policy shares, and the victim planning they have in common.

The agent (and the simulator in ``bench/eviction.py``) drives one policy object per cache scope:

- ``on_insert(block, parent, size_bytes, now)`` when a block is stored (``parent`` is the previous block's
  key, ``None`` for the first block of a prefix);
- ``on_access(block, now)`` when a stored block is read or re-put;
- ``on_request(blocks, size_bytes, now)`` for a whole request: the prefix hit, then the two calls above;
- ``select_victims(bytes_to_free, now)`` to plan removals: an ordered list of keys, orphans first, then
  blocks each of which is a leaf once the ones before it are gone — removing them in order orphans nothing;
  the plan changes nothing until the caller reports each removal with ``on_remove``;
- ``on_remove(block)`` after the store lost a block, whether the agent removed it or the master evicted it;
  it returns the keys that the removal orphaned (only a removal from outside the plan can orphan any).

Times are seconds on the caller's clock (any origin; equal or increasing between calls). Sizes are bytes.
Calls for the blocks of one request must come in prefix order, root first, as the engine looks them up.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable, Sequence

from agent.datapath.eviction.tree import Block, PrefixTree

Key = Hashable


class EvictionPolicy(ABC):
    """Base class: a :class:`PrefixTree` plus the calls above. Subclasses rank the attached leaves.

    Subclasses implement :meth:`_leaf_added`, :meth:`_leaf_removed`, :meth:`_touched` and
    :meth:`_plan`. Attributes: :attr:`name` (short label), :attr:`tree`.
    """

    name = "base"

    #: Infer reads from stores: storing a new block under a present parent means the request that stored it
    #: used the whole prefix above it, so those blocks count as accessed (once per request). For callers that
    #: see only stores, like an agent fed by engine KV events; with read reports as well it would count a
    #: request's reads twice. Set on the instance.
    infer_access = False

    def __init__(self) -> None:
        self.tree = PrefixTree(
            on_leaf=self._leaf_added, off_leaf=self._leaf_removed, on_branch=self._leaf_rebranched
        )
        self.now = 0.0

    # -- the interface ---------------------------------------------------------------------------------
    def on_insert(self, block: Key, parent: Key | None, size_bytes: int, now: float) -> None:
        """A block was stored. A present ``block`` counts as an access (its parent must then match).

        Raises ``ValueError`` when ``block`` is present under another parent, is its own parent, or
        ``size_bytes`` is negative.
        """
        self._clock(now)
        node = self.tree.get(block)
        if node is not None:
            if node.parent_key != parent:
                raise ValueError(
                    f"block {block!r} is stored under parent {node.parent_key!r}, not {parent!r}: "
                    "block keys must name their whole prefix"
                )
            self._access(node, now)
            return
        if self.infer_access and parent is not None:
            self._infer_prefix_read(parent, now)
        node = self.tree.insert(block, parent, size_bytes, now)
        self.tree.mark_inserted(node)
        self._touched(node, now, True)

    def _infer_prefix_read(self, parent: Key, now: float) -> None:
        """Touch the attached prefix ending at ``parent``, root first, down from the first block not yet
        touched at ``now`` (O(blocks touched): each block of a request at most once)."""
        node = self.tree.get(parent)
        if node is None or not node.attached:
            return
        chain: list[Block] = []
        while node is not None and node.last < now:
            chain.append(node)
            node = node.parent
        for block in reversed(chain):
            self._access(block, now)

    def on_access(self, block: Key, now: float) -> None:
        """A stored block was read. Raises ``KeyError`` when ``block`` is not in the tree."""
        self._clock(now)
        node = self.tree.get(block)
        if node is None:
            raise KeyError(f"block {block!r} is not in the tree")
        self._access(node, now)

    def on_remove(self, block: Key) -> list[Key]:
        """The store no longer holds ``block``. Returns the keys this orphaned (empty for a leaf).

        Raises ``KeyError`` when ``block`` is not in the tree.
        """
        node = self.tree.get(block)
        if node is None:
            raise KeyError(f"block {block!r} is not in the tree")
        self._removing(node)
        return self.tree.remove(block)

    def on_request(self, blocks: Sequence[Key], size_bytes: int | Sequence[int], now: float) -> int:
        """Replay one request's prefix blocks (root first): returns the prefix hit, then stores or reads each.

        The prefix hit is the number of leading blocks present and attached before the call (a lookup stops
        at the first miss). ``size_bytes``: one size for every block, or one per block (used for inserts).
        """
        hit = 0
        for key in blocks:
            node = self.tree.get(key)
            if node is None or not node.attached:
                break
            hit += 1
        parent = None
        for i, key in enumerate(blocks):
            size = size_bytes if isinstance(size_bytes, int) else size_bytes[i]
            self.on_insert(key, parent, size, now)
            parent = key
        return hit

    def select_victims(self, bytes_to_free: int, now: float | None = None) -> list[Key]:
        """Plan removals freeing at least ``bytes_to_free`` bytes (fewer if the tree holds less).

        Order: orphaned blocks first (children before parents), then the policy's choice among attached
        leaves, where a block whose children are all earlier in the list counts as a leaf. Removing the keys
        in this order never orphans a block. Nothing changes until :meth:`on_remove` is called.
        """
        if bytes_to_free <= 0:
            return []
        if now is not None:
            self._clock(now)
        victims: list[Key] = []
        need = bytes_to_free
        for root in list(self.tree.orphan_roots()):
            for node in _post_order(root):
                victims.append(node.key)
                need -= node.size
                if need <= 0:
                    return victims
        for node in self._plan(need, self.now):
            victims.append(node.key)
        return victims

    def evict(self, bytes_to_free: int, now: float | None = None) -> list[Key]:
        """:meth:`select_victims` then :meth:`on_remove` for each; returns the removed keys."""
        victims = self.select_victims(bytes_to_free, now)
        for key in victims:
            self.on_remove(key)
        return victims

    # -- accounting ------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.tree)

    def __contains__(self, block: object) -> bool:
        return block in self.tree

    @property
    def used_bytes(self) -> int:
        """Bytes of all present blocks (attached or orphaned)."""
        return self.tree.bytes

    @property
    def orphaned_blocks(self) -> int:
        """Present blocks a prefix lookup cannot reach (an ancestor is missing)."""
        return self.tree.orphaned_blocks

    @property
    def orphaned_bytes(self) -> int:
        """Bytes of :attr:`orphaned_blocks`."""
        return self.tree.orphaned_bytes

    # -- for subclasses --------------------------------------------------------------------------------
    def _clock(self, now: float) -> None:
        if now > self.now:
            self.now = now

    def _access(self, node: Block, now: float) -> None:
        self.tree.touch(node, now)
        self._touched(node, now, False)

    def _leaf_added(self, node: Block) -> None:
        """An attached block became a leaf."""

    def _leaf_removed(self, node: Block) -> None:
        """An attached leaf stopped being one (child added, removed, or detached)."""

    def _leaf_rebranched(self, node: Block) -> None:
        """An attached leaf's branch top changed (``node.top``); it is still a leaf."""

    def _touched(self, node: Block, now: float, inserted: bool) -> None:
        """A block was inserted (``inserted``) or accessed; ``node.count``/``last``/``tail`` are updated."""

    def _removing(self, node: Block) -> None:
        """``node`` is about to be removed (by the plan or from outside)."""

    @abstractmethod
    def _plan(self, need: int, now: float) -> Iterable[Block]:
        """Attached blocks to remove, leaf-first, until their sizes reach ``need`` bytes (no side effects)."""


class PlanState:
    """Book-keeping for one non-mutating plan: which blocks are planned and which became leaves.

    A parent becomes a *virtual leaf* once all its children are planned; :meth:`plan` returns it then.
    """

    __slots__ = ("planned", "_pending")

    def __init__(self) -> None:
        self.planned: set[int] = set()
        self._pending: dict[int, int] = {}

    def is_planned(self, node: Block) -> bool:
        """True when ``node`` is already in the plan."""
        return id(node) in self.planned

    def plan(self, node: Block) -> Block | None:
        """Add ``node``; return its parent when that parent is now a virtual leaf, else ``None``."""
        self.planned.add(id(node))
        parent = node.parent
        if parent is None or not parent.attached:
            return None
        pid = id(parent)
        done = self._pending.get(pid, 0) + 1
        self._pending[pid] = done
        if done == len(parent.children):  # type: ignore[arg-type]
            return parent
        return None


def _post_order(root: Block) -> list[Block]:
    """The subtree at ``root``, children before parents."""
    out: list[Block] = []
    stack: list[tuple[Block, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded or not node.children:
            out.append(node)
            continue
        stack.append((node, True))
        for child in node.children.values():
            stack.append((child, False))
    return out
