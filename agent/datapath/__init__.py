"""The data path: block hashes, cache scopes, the zero-copy connector to Mooncake Store, the occupancy ledger,
budgets and eviction policies."""
