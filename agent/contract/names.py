"""Name rules both sides enforce: the registry when a node or request group is saved (``tenants.validators``),
the agent when it starts (``kvpool-agent run --node``), so an agent never runs under a name the registry cannot
register (its queue ``agent.<node>`` and its state paths would never receive a config document)."""
from __future__ import annotations

import re

#: A DNS label: 1-63 lower-case letters, digits and inner ``-`` (``node-a``). Node and request group names.
DNS_LABEL_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


def is_node_name(value: str) -> bool:
    """True when ``value`` is a node name the registry accepts (``DNS_LABEL_RE``, whole string)."""
    return DNS_LABEL_RE.fullmatch(value) is not None
