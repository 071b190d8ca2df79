"""Reading agent messages of older schemas: the one place that knows their retired field names.

Report schema 1 (agents before the ``CacheScope`` names) listed its rows under ``namespaces`` and named a row's
request group ``salt_group``; schema 2 calls them ``scopes`` and ``request_group``
(``agent.contract.messages.REPORT_SCHEMA_VERSION``). :func:`upgrade` rewrites such a report to the current schema
**after** its signature was checked (the signature covers the bytes the agent sent), so agents that have not
been upgraded yet keep reporting. Any other message is returned unchanged.
"""
from __future__ import annotations

from typing import Any

from agent.contract.messages import REPORT_SCHEMA_VERSION

#: Report schema 1's name of a row's request group.
V1_GROUP_FIELD = "salt_group"
#: Report schema 1's name of the list of rows.
V1_ROWS_FIELD = "namespaces"


def upgrade(raw: Any) -> Any:
    """``raw`` in the current schema when it is a schema-1 report (a new dict; ``raw`` is left as it is), else
    ``raw`` itself. Rows that are not objects are passed on for the schema to refuse."""
    if not isinstance(raw, dict) or raw.get("kind") != "report" or raw.get("schema") != 1:
        return raw
    out = {key: value for key, value in raw.items() if key != V1_ROWS_FIELD}
    out["schema"] = REPORT_SCHEMA_VERSION
    rows = raw.get(V1_ROWS_FIELD, [])
    if isinstance(rows, list):
        rows = [_upgrade_row(row) for row in rows]
    out["scopes"] = rows
    return out


def _upgrade_row(row: Any) -> Any:
    if not isinstance(row, dict) or V1_GROUP_FIELD not in row or "request_group" in row:
        return row  # nothing to rename, or both names: the schema refuses it
    out = {key: value for key, value in row.items() if key != V1_GROUP_FIELD}
    out["request_group"] = row[V1_GROUP_FIELD]
    return out


__all__ = ["upgrade"]
