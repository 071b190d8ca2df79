"""The contract both sides import: broker message schemas (with the Store endpoints), their signatures, the Store
key grammar and the cache scope (the identity of an occupancy row).

The dashboard imports the agent only through this package.
"""
