"""Outside the product path: the engine simulator (demo load, benchmarks), the FAST'25 trace reader and a
``mooncake_master`` launcher for tests and demos."""
