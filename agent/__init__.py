"""Node agent: block hashes, key grammar, the KV connector to Mooncake Store, the occupancy ledger, the daemon.

Nothing in this package imports Django: GPU nodes run it without a database.
"""
