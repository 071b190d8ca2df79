"""Telemetry from agents: message authentication, ingest and its drain, rollups, queries behind the charts, /metrics."""
