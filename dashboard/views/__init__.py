"""Server-rendered pages of the operators' dashboard (routes in ``dashboard/page_urls.py``; login required; a
change needs the model permission the REST API needs for it, see ``base.permission_denied``).

Modules: ``overview`` (store, tenants, nodes, warnings), ``occupancy`` (chart page + JSON data), ``registry`` (lists,
detail pages, rendered config downloads), ``edit`` (create / edit / delete forms), ``upgrade`` (rolling upgrade and
purge), ``checks`` (the seed's checklist), ``audit`` (audit log); ``dashboard.telemetry.queries`` holds the read-side
queries they share with ``dashboard.checklist`` and ``dashboard.rollout.upgrade``.
"""
