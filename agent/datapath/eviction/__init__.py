"""Prefix-aware eviction for one cache scope's blocks in the Store (no Django).

- :class:`PrefixTree` / :class:`Block`: the blocks, their parents, leaves and orphans (``tree.py``).
- :class:`EvictionPolicy`: the interface the agent and the simulator drive (``base.py``).
- :class:`LeafLRUPolicy`, :class:`PlainLRUPolicy`: baselines (``lru.py``).
- :class:`HitDensityPolicy`: the prefix-aware policy (``density.py``); why it works: ``docs/eviction.md``.
- :class:`BeladyPolicy`: the offline optimum, for the simulator (``belady.py``).
"""

from agent.datapath.eviction.base import EvictionPolicy
from agent.datapath.eviction.belady import BeladyPolicy
from agent.datapath.eviction.density import HitDensityPolicy
from agent.datapath.eviction.lru import LeafLRUPolicy, PlainLRUPolicy
from agent.datapath.eviction.tree import Block, PrefixTree

__all__ = [
    "Block",
    "BeladyPolicy",
    "EvictionPolicy",
    "HitDensityPolicy",
    "LeafLRUPolicy",
    "PlainLRUPolicy",
    "PrefixTree",
]
