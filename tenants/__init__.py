"""The registry: tenants, served models, release namespaces, request groups, nodes and assignments."""
