"""The identity of one occupancy row, the same on the node and in the dashboard (no Django, no pydantic).

A :class:`CacheScope` names the blocks that are counted, budgeted and charted together: one tenant, one served
model, one release namespace (vLLM ``cache_prefix`` / SGLang ``extra_backend_tag``) and one request group (the
requests sharing one ``cache_salt``). The agent's ledger and budgets are keyed by it, each ``Report`` row carries
its four fields (``agent.contract.messages.ScopeOccupancy``), and the dashboard stores, filters and charts by them.

``request_group`` has four kinds of value, one meaning each:

* a request group's name (``RequestGroup.name``, a DNS label): that group's row;
* :data:`NO_REQUEST_GROUP` (``""``): the release's row of the blocks of an instance whose config document carries
  no request groups (its tenant has none; ``agent.datapath.keyspace``);
* :data:`ENGINE_LOOKUPS` (``"(engine)"``, which no request group name can be): the release's row of the real
  engines' external prefix-cache lookups (hit and miss blocks only, never bytes), which an engine does not tell
  apart by request group (``agent.node.engines``);
* ``None`` (never a row, never on the wire): the **whole release**, every row of it together
  (:meth:`CacheScope.release_scope`; the dashboard's series, current occupancy and the rolling upgrade key
  releases by it, and a filter of ``None`` selects every group).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

#: ``request_group`` of a release's row without a request group (module docstring); a row's value, never "all".
NO_REQUEST_GROUP = ""
#: ``request_group`` of a release's row of the engines' prefix-cache lookups (module docstring): parentheses are
#: outside the request group name grammar (``tenants.validators``), so no group can take it.
ENGINE_LOOKUPS = "(engine)"


class CacheScope(NamedTuple):
    """``(tenant_id, served_model_name, namespace, request_group)``: the identity of an occupancy row, or with
    ``request_group`` ``None`` (the default) of a whole release.

    ``namespace`` is the release namespace string; ``request_group`` a request group's name, ``""``
    (:data:`NO_REQUEST_GROUP`) or ``None`` (module docstring).
    """

    tenant_id: str
    served_model_name: str
    namespace: str
    request_group: str | None = None

    def release_scope(self) -> CacheScope:
        """This scope with ``request_group`` ``None``: the whole release (every row of it together)."""
        return self._replace(request_group=None) if self.request_group is not None else self

    @property
    def label(self) -> str:
        """``tenant/model/namespace`` for a whole release, ``tenant/model/namespace/group`` for a row ("-" for an
        empty part, so the row without a request group ends in ``/-``)."""
        parts = list(self[:3]) + ([self.request_group] if self.request_group is not None else [])
        return "/".join(part or "-" for part in parts)


def instance_scopes(tenant_id: str, served_model_name: str, namespace: str,
                    request_groups: Iterable[str]) -> set[CacheScope]:
    """The cache scopes (rows) one instance of a config document speaks for: one per request group of
    ``request_groups`` (names), the release's row without a request group (:data:`NO_REQUEST_GROUP`: an instance
    without groups) and its row of the engines' lookups (:data:`ENGINE_LOOKUPS`).

    A node's reports carry rows of these scopes only (the agent filters its ledger by them; the dashboard's ingest
    refuses any other row, ``dashboard.telemetry.report_scope``).
    """
    no_group = CacheScope(tenant_id, served_model_name, namespace, NO_REQUEST_GROUP)
    return {no_group, no_group._replace(request_group=ENGINE_LOOKUPS),
            *(no_group._replace(request_group=group) for group in request_groups)}


__all__ = ["ENGINE_LOOKUPS", "NO_REQUEST_GROUP", "CacheScope", "instance_scopes"]
