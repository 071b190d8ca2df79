"""Delivery layer: REST API, admin, pages and charts, Celery tasks, Prometheus metrics, settings."""
