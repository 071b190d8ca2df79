"""Observers of real inference engines on a node: their KV-cache events and metrics, fed into the node's ledger.

One sub-package per engine (:mod:`agent.engines.vllm`). No Django here (the agent never imports it).
"""
