"""The identity of one occupancy row, the same on the node and in the dashboard (no Django, no pydantic).

A :class:`CacheScope` names the blocks that are counted, budgeted and charted together: one tenant, one served
model, one release namespace (vLLM ``cache_prefix`` / SGLang ``extra_backend_tag``) and one request group (the
requests sharing one ``cache_salt``). The agent's ledger and budgets are keyed by it, each ``Report`` row carries
its four fields (``agent.contract.messages.ScopeOccupancy``), and the dashboard stores, filters and charts by them.

``request_group`` "" is the agent's default group (an instance configured without request groups). Where the
dashboard sums a release's groups together (charts, current occupancy, the rolling upgrade) it uses
:meth:`CacheScope.release_scope`, the scope with ``request_group`` "": a filter of "" selects every group too.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple


class CacheScope(NamedTuple):
    """``(tenant_id, served_model_name, namespace, request_group)``: the identity of an occupancy row.

    ``namespace`` is the release namespace string; ``request_group`` the request group's name.
    """

    tenant_id: str
    served_model_name: str
    namespace: str
    request_group: str = ""

    def release_scope(self) -> CacheScope:
        """This scope with ``request_group`` "": the whole release (every request group together)."""
        return self._replace(request_group="") if self.request_group else self

    @property
    def label(self) -> str:
        """``tenant/model/namespace[/group]`` ("-" for an empty part; the group only when set)."""
        parts = list(self[:3]) + ([self.request_group] if self.request_group else [])
        return "/".join(part or "-" for part in parts)


def instance_scopes(tenant_id: str, served_model_name: str, namespace: str,
                    request_groups: Iterable[str]) -> set[CacheScope]:
    """The cache scopes one instance of a config document speaks for: one per request group of
    ``request_groups`` (names) and the release scope (``request_group`` "": the default group of an instance
    without groups, and where the engines' prefix-cache hits are credited).

    A node's reports carry rows of these scopes only (the agent filters its ledger by them; the dashboard's ingest
    refuses any other row, ``dashboard.telemetry.report_scope``).
    """
    release = CacheScope(tenant_id, served_model_name, namespace)
    return {release, *(release._replace(request_group=group) for group in request_groups)}


__all__ = ["CacheScope", "instance_scopes"]
