"""Shared fixtures. Service fixtures (mooncake_master, redis, workers) start real processes on free ports."""
