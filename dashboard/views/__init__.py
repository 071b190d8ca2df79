"""Server-rendered pages of the operators' dashboard (routes in ``dashboard/page_urls.py``; login required; each
page shows only the user's tenants and a change needs the permission the REST API needs for it, under the tenant
rules of ``tenants.access``: see ``base.visible`` and ``base.permission_denied``).

Modules: ``overview`` (store, tenants, nodes, warnings), ``occupancy`` (chart page + JSON data), ``registry`` (lists,
detail pages, rendered config downloads), ``edit`` (create / edit / delete forms), ``upgrade`` (rolling upgrade and
purge), ``checks`` (the seed's checklist, platform admins), ``audit`` (audit log), ``accounts`` (login lockout,
password reset only with mail); ``dashboard.telemetry.queries`` holds the read-side
queries they share with ``dashboard.checklist`` and ``dashboard.rollout.upgrade``.
"""
