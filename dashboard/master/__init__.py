"""The Mooncake master: its tenant quota admin API and the registry -> master quota sync."""
