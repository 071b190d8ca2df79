"""Node agent (no Django: GPU nodes run it without a database). Subpackages by role:

- :mod:`agent.contract` — what crosses a process boundary and both sides import: broker messages
  (``messages``), their HMAC signatures (``signing``), the Store key grammar (``keys``).
- :mod:`agent.datapath` — KV blocks into and out of Mooncake Store: block hashing, cache scopes, the zero-copy
  connector, the occupancy ledger, budgets and eviction policies.
- :mod:`agent.node` — the daemon on each node: command line, Celery wiring, outbox, purge handling.
- :mod:`agent.sim` — outside the product path: the engine simulator (demo load and benchmarks), the FAST'25
  trace reader and a ``mooncake_master`` launcher for tests.
"""
