"""agent/datapath/eviction/tree.py: parents, leaves, branch tops and orphan accounting."""

import pytest

from agent.datapath.eviction.tree import PrefixTree


class Recorder:
    def __init__(self):
        self.leaves = set()

    def on(self, node):
        assert node.key not in self.leaves, f"{node.key} announced twice as a leaf"
        self.leaves.add(node.key)

    def off(self, node):
        assert node.key in self.leaves, f"{node.key} was not a leaf"
        self.leaves.remove(node.key)


def make():
    rec = Recorder()
    return PrefixTree(rec.on, rec.off), rec


def chain(tree, keys, parent=None, size=1, now=0.0):
    for key in keys:
        tree.insert(key, parent, size, now)
        parent = key


def test_chain_leaves_depth_and_branch_top():
    tree, rec = make()
    chain(tree, ["r", "a", "b"])
    assert rec.leaves == {"b"}
    assert [tree.get(k).depth for k in "rab"] == [0, 1, 2]
    assert tree.get("b").top is tree.get("r")
    tree.insert("c", "a", 1, 1.0)  # a now has two children: two branches start below it
    assert rec.leaves == {"b", "c"}
    assert tree.get("b").top is tree.get("b")
    assert tree.get("c").top is tree.get("c")
    assert tree.get("a").top is tree.get("r")


def test_removing_a_branch_merges_the_other_into_its_parent_branch():
    tree, rec = make()
    chain(tree, ["r", "a", "b", "b2"])
    tree.insert("c", "a", 1, 0.0)
    assert tree.get("b2").top is tree.get("b")
    assert tree.remove("c") == []
    assert tree.get("b2").top is tree.get("r")
    assert rec.leaves == {"b2"}


def test_remove_leaf_makes_parent_a_leaf_and_orphans_nothing():
    tree, rec = make()
    chain(tree, ["r", "a", "b"], size=10)
    assert tree.remove("b") == []
    assert rec.leaves == {"a"}
    assert (len(tree), tree.bytes, tree.orphaned_blocks) == (2, 20, 0)


def test_remove_inner_block_orphans_its_subtree_and_reinsert_heals_it():
    tree, rec = make()
    chain(tree, ["r", "a", "b", "c"], size=10)
    tree.insert("d", "b", 5, 0.0)
    orphaned = tree.remove("a")
    assert sorted(orphaned) == ["b", "c", "d"]
    assert (tree.orphaned_blocks, tree.orphaned_bytes, tree.orphaned_total) == (3, 25, 3)
    assert rec.leaves == {"r"}
    assert [b.key for b in tree.orphan_roots()] == ["b"]
    assert not tree.get("c").attached
    tree.insert("a", "r", 10, 1.0)
    assert (tree.orphaned_blocks, tree.orphaned_bytes) == (0, 0)
    assert rec.leaves == {"c", "d"}
    assert all(tree.get(k).attached for k in "rabcd")
    assert tree.get("b").depth == 2 and tree.get("c").depth == 3
    assert tree.get("c").top is tree.get("c") and tree.get("a").top is tree.get("r")


def test_block_inserted_before_its_parent_is_an_orphan_until_the_parent_arrives():
    tree, rec = make()
    tree.insert("b", "a", 4, 0.0)
    assert (tree.orphaned_blocks, tree.orphaned_bytes) == (1, 4)
    assert rec.leaves == set()
    tree.insert("a", None, 4, 0.0)
    assert tree.orphaned_blocks == 0
    assert rec.leaves == {"b"}
    assert tree.get("b").parent is tree.get("a")


def test_removing_orphans_orphans_nothing_more():
    tree, _ = make()
    chain(tree, ["r", "a", "b"])
    tree.remove("r")
    assert tree.orphaned_blocks == 2
    assert tree.remove("b") == []
    assert tree.remove("a") == []
    assert tree.orphaned_blocks == 0 and len(tree) == 0
    assert list(tree.orphan_roots()) == []


def test_insert_errors():
    tree, _ = make()
    tree.insert("a", None, 1, 0.0)
    with pytest.raises(KeyError):
        tree.insert("a", None, 1, 0.0)
    with pytest.raises(ValueError, match="own parent"):
        tree.insert("x", "x", 1, 0.0)
    with pytest.raises(ValueError, match=">= 0 bytes"):
        tree.insert("y", "a", -1, 0.0)
    with pytest.raises(KeyError):
        tree.remove("zzz")


def test_tail_flag_marks_where_the_latest_request_ended():
    tree, _ = make()
    chain(tree, ["r", "a", "b"])
    for key in ("r", "a", "b"):
        tree.mark_inserted(tree.get(key))
    assert [tree.get(k).tail for k in "rab"] == [False, False, True]
    tree.touch(tree.get("r"), 1.0)
    tree.touch(tree.get("a"), 1.0)
    assert tree.get("a").tail and not tree.get("r").tail
    assert tree.get("a").count == 2 and tree.get("a").last == 1.0
