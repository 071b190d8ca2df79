"""The node runtime: the agent's command line, the daemon that applies config documents and sends telemetry,
its Celery wiring, the disk outbox and the purge handler."""
