"""REST API (DRF) under /api/v1/."""
