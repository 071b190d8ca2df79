"""Prefix tree of the blocks a cache scope holds in the Store, with orphan accounting.

A block's key (vLLM 0.33.0 / SGLang 0.5.23 chained block hash) names its whole prefix, so each block has one
parent: the block before it. A prefix lookup walks from the root and stops at the first missing block, so a
block whose parent is gone can never be hit again: it is **orphaned** and its bytes are wasted. Orphans appear
when something removes an inner block, typically the master's own eviction, which knows no prefixes. They stop
being orphans when the missing parent is stored again.

The tree keeps, per block: key, parent key, size (bytes), depth (blocks from the root, 0 = root), access
count, first and last access time (seconds, caller's clock), children, whether it is attached (every
ancestor present), whether the latest request through it ended at it (``tail``), and the top of its branch
(see :attr:`Block.top`). Eviction policies own a tree and are told when an attached block becomes or stops
being a leaf; only attached leaves are eviction candidates, so leaf-first removal never creates an orphan.

Costs: insert/access/remove of a block are O(1) plus, when a branch splits or merges, a walk down the one-child
chain below the branch point (at most the prefix depth in blocks); detaching or re-attaching a subtree is
O(size of that subtree), paid once per external removal or re-insertion.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator

Key = Hashable


class Block:
    """One stored block (a node of the prefix tree). Fields are read by policies; only the tree writes them.

    - ``key``, ``parent_key`` (``None`` for a root), ``parent`` (the parent :class:`Block` when present)
    - ``size``: bytes; ``depth``: blocks above it (valid while attached)
    - ``count``: accesses including the insert; ``first`` / ``last``: first and latest access (seconds)
    - ``children``: ``None`` or a dict key -> Block of the present children
    - ``attached``: every ancestor is present, so a prefix lookup can reach it
    - ``tail``: the latest request that touched it ended here (no child was touched after it)
    - ``top``: the highest ancestor reachable through one-child blocks (the start of its *branch*); when the
      block is a leaf, ``top.count`` is how many requests entered the branch that evicting the leaf and its
      one-child ancestors would give up — the reuse of that whole subtree
    - ``slot``, ``ver``, ``prio``: bookkeeping owned by the policy
    """

    __slots__ = (
        "key",
        "parent_key",
        "parent",
        "children",
        "size",
        "depth",
        "count",
        "first",
        "last",
        "attached",
        "tail",
        "top",
        "slot",
        "ver",
        "prio",
    )

    def __init__(self, key: Key, parent_key: Key | None, size: int, now: float) -> None:
        self.key = key
        self.parent_key = parent_key
        self.parent: Block | None = None
        self.children: dict[Key, Block] | None = None
        self.size = size
        self.depth = 0
        self.count = 1
        self.first = now
        self.last = now
        self.attached = False
        self.tail = True
        self.top: Block = self
        self.slot = -1
        self.ver = 0
        self.prio: object = None

    @property
    def is_leaf(self) -> bool:
        """True when the block has no present child."""
        return not self.children

    def __repr__(self) -> str:
        return f"Block({self.key!r}, parent={self.parent_key!r}, count={self.count}, attached={self.attached})"


LeafHook = Callable[[Block], None]


class PrefixTree:
    """Blocks of one cache scope keyed by block key, with parent links, leaves and orphans.

    ``on_leaf(block)`` is called when an attached block becomes a leaf (inserted without children, its last
    child removed, or its subtree re-attached); ``off_leaf(block)`` when an attached leaf stops being one (it
    gets a child, is removed, or loses an ancestor); ``on_branch(block)`` when an attached leaf stays a leaf
    but its branch top changed (a sibling appeared or left above it). Each may be ``None``.

    Counters: ``len(tree)`` blocks, :attr:`bytes` total, :attr:`orphaned_blocks` / :attr:`orphaned_bytes`
    (present but unreachable), :attr:`orphaned_total` (blocks ever orphaned by :meth:`remove`).
    """

    def __init__(
        self,
        on_leaf: LeafHook | None = None,
        off_leaf: LeafHook | None = None,
        on_branch: LeafHook | None = None,
    ) -> None:
        self._nodes: dict[Key, Block] = {}
        # Orphan roots waiting for their missing parent: parent key -> {key: block}.
        self._waiting: dict[Key, dict[Key, Block]] = {}
        self._on_leaf = on_leaf or (lambda b: None)
        self._off_leaf = off_leaf or (lambda b: None)
        self._on_branch = on_branch or (lambda b: None)
        self.bytes = 0
        self.orphaned_blocks = 0
        self.orphaned_bytes = 0
        self.orphaned_total = 0

    # -- queries ---------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, key: object) -> bool:
        return key in self._nodes

    def get(self, key: Key) -> Block | None:
        """The block for ``key``, or ``None``."""
        return self._nodes.get(key)

    def blocks(self) -> Iterator[Block]:
        """All present blocks, attached or not, in insertion order."""
        return iter(self._nodes.values())

    def orphan_roots(self) -> Iterator[Block]:
        """Present blocks whose parent is missing (each heads a detached subtree)."""
        for group in self._waiting.values():
            yield from group.values()

    # -- mutations -------------------------------------------------------------------------------------
    def insert(self, key: Key, parent_key: Key | None, size: int, now: float) -> Block:
        """Add a new block; it is attached when ``parent_key`` is ``None`` or an attached present block.

        Orphans waiting for ``key`` are adopted (their subtrees re-attach when the new block is attached).
        Raises ``KeyError`` when ``key`` is already present and ``ValueError`` when ``key == parent_key`` or
        ``size`` is negative.
        """
        if key in self._nodes:
            raise KeyError(f"block {key!r} is already in the tree")
        if key == parent_key:
            raise ValueError(f"block {key!r} cannot be its own parent")
        if size < 0:
            raise ValueError(f"size of block {key!r} must be >= 0 bytes, got {size}")
        node = Block(key, parent_key, size, now)
        self._nodes[key] = node
        self.bytes += size
        parent = self._nodes.get(parent_key) if parent_key is not None else None
        if parent is not None:
            self._link(parent, node)
        elif parent_key is not None:
            self._waiting.setdefault(parent_key, {})[key] = node
        node.attached = parent_key is None or (parent is not None and parent.attached)
        if not node.attached:
            self.orphaned_blocks += 1
            self.orphaned_bytes += size
        elif parent is not None:
            self._attach_under(parent, node)
        adopted = self._waiting.pop(key, None)
        if adopted:
            for child in adopted.values():
                self._link(node, child)
            if node.attached:
                for child in adopted.values():
                    self._reattach(child)
        if node.attached and not node.children:
            self._on_leaf(node)
        return node

    def touch(self, node: Block, now: float) -> None:
        """Record an access: count, last time, and the tail flags (call in prefix order, root first)."""
        node.count += 1
        if now > node.last:
            node.last = now
        node.tail = True
        if node.parent is not None:
            node.parent.tail = False

    def mark_inserted(self, node: Block) -> None:
        """Set the tail flags after :meth:`insert` (the insert itself counts as the first access)."""
        node.tail = True
        if node.parent is not None:
            node.parent.tail = False

    def remove(self, key: Key) -> list[Key]:
        """Remove a block and return the keys it orphaned (its attached descendants, now unreachable).

        Removing a leaf or an orphan orphans nothing. Raises ``KeyError`` when ``key`` is not present.
        """
        node = self._nodes.pop(key)
        self.bytes -= node.size
        orphaned: list[Key] = []
        if node.attached:
            if not node.children:
                self._off_leaf(node)
        else:
            self.orphaned_blocks -= 1
            self.orphaned_bytes -= node.size
        if node.children:
            waiting = self._waiting.setdefault(key, {})
            for child in node.children.values():
                child.parent = None
                waiting[child.key] = child
                if node.attached:
                    self._detach(child, orphaned)
            node.children = None
        parent = node.parent
        if parent is not None:
            assert parent.children is not None  # a block with a parent is among its children
            del parent.children[key]
            if not parent.children:
                parent.children = None
            if parent.attached:
                self._after_child_removed(parent)
        elif node.parent_key is not None:
            group = self._waiting.get(node.parent_key)
            if group is not None:
                group.pop(key, None)
                if not group:
                    del self._waiting[node.parent_key]
        node.parent = None
        node.attached = False
        node.ver = -1
        self.orphaned_total += len(orphaned)
        return orphaned

    # -- internals -------------------------------------------------------------------------------------
    @staticmethod
    def _link(parent: Block, child: Block) -> None:
        child.parent = parent
        if parent.children is None:
            parent.children = {}
        parent.children[child.key] = child

    def _attach_under(self, parent: Block, node: Block) -> None:
        """Bookkeeping when attached ``node`` was just linked under attached ``parent``."""
        node.depth = parent.depth + 1
        n_children = len(parent.children)  # type: ignore[arg-type]
        if n_children == 1:
            self._off_leaf(parent)
            node.top = parent.top
        else:
            node.top = node
            if n_children == 2:
                # The branch through the other child splits off at that child.
                other = next(c for c in parent.children.values() if c is not node)  # type: ignore[union-attr]
                self._set_branch(other, other)

    def _after_child_removed(self, parent: Block) -> None:
        if not parent.children:
            self._on_leaf(parent)
        elif len(parent.children) == 1:
            # The remaining child's branch merges into the parent's branch.
            only = next(iter(parent.children.values()))
            self._set_branch(only, parent.top)

    def _set_branch(self, start: Block, top: Block) -> None:
        node = start
        while True:
            node.top = top
            children = node.children
            if children is None:
                if node.attached:
                    self._on_branch(node)
                return
            if len(children) != 1:
                return
            node = next(iter(children.values()))

    def _detach(self, root: Block, orphaned: list[Key]) -> None:
        stack = [root]
        while stack:
            node = stack.pop()
            if not node.children:
                self._off_leaf(node)
            node.attached = False
            self.orphaned_blocks += 1
            self.orphaned_bytes += node.size
            orphaned.append(node.key)
            if node.children:
                stack.extend(node.children.values())

    def _reattach(self, root: Block) -> None:
        """Attach the detached subtree at ``root``, whose parent was just linked and is attached."""
        parent = root.parent
        assert parent is not None and parent.children is not None
        root.attached = True
        self.orphaned_blocks -= 1
        self.orphaned_bytes -= root.size
        # Branch bookkeeping for root exactly as for a fresh insert, except the leaf hook of the parent:
        # a parent with one child here was a leaf only if root is its sole child and it was just inserted,
        # in which case insert() has not announced it as a leaf yet.
        root.depth = parent.depth + 1
        if len(parent.children) == 1:
            root.top = parent.top
        else:
            root.top = root
            if len(parent.children) == 2:
                other = next(c for c in parent.children.values() if c is not root)
                if other.attached:
                    self._set_branch(other, other)
        stack = [root]
        while stack:
            node = stack.pop()
            children = node.children
            if not children:
                self._on_leaf(node)
                continue
            single = len(children) == 1
            for child in children.values():
                child.attached = True
                self.orphaned_blocks -= 1
                self.orphaned_bytes -= child.size
                child.depth = node.depth + 1
                child.top = node.top if single else child
                stack.append(child)
