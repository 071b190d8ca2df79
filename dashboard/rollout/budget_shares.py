"""Each node's share of a budget that several nodes write: moved toward demand, from the nodes' reports.

A release's (or a request group's, per release) budget written by instances on several nodes is split between the
nodes; each agent holds only its own writes under its share (``node_budget_bytes``). Split by writer instances alone
(:func:`static_share`), uneven traffic wastes the budget: one node is trimmed at its share while the other's sits
unused. Here the split follows demand:

* **inputs** per node of a budget (:class:`NodeDemand`): its writer instances, the bytes it holds of the budget's cache
  scopes (its newest raw ``OccupancySample``), whether it reported within ``WINDOW_SECONDS``, whether its agent
  trimmed the budget's scopes in that window (``budget_evicted_blocks`` grew), whether it wrote in it (``puts``
  grew) and its share in its current document; a render reads at most ``WINDOW_ROWS`` reports of each node and
  scope from the window and a silent node's newest one only (reports are not rate-limited);
* **policy** (:func:`plan_shares`, pure): a node trimmed at its share, or writing and holding at least ``PRESSED``
  of it, is *pressed*; every other node gets what it holds plus ``HEADROOM`` (it gives the rest back; no headroom
  once it stopped writing: its ``puts`` did not grow in the window), a silent node what it last held (its unused
  share is lent, the blocks it holds stay counted); the pressed nodes split what is left in proportion to what they
  hold: of a new or changed budget, all of it; else up to their current shares, and a trimmed one its current share
  (a report taken before or during a trim still shows the blocks it removes: :func:`_pressed_weight`).
  Every node keeps a floor (``FLOOR_FRACTION`` of its writer-proportional share), the shares sum to exactly the
  budget, and a plan replaces the current shares only when one of them moves by more than ``HYSTERESIS`` (or the
  current ones no longer fit the budget), so documents are not re-pushed for noise. Nobody reporting: the writer
  split.
* **where it runs**: ``dashboard.rollout.push.render_contents`` asks a :class:`ShareBook` (loaded once per render;
  only budgets with writers on two or more nodes read samples) instead of the static split. The periodic reconcile
  (``dashboard.reconcile_configs``, every ``KVPOOL_RECONCILE_SECONDS``) re-renders every node, so shares follow
  demand at that pace; nothing runs on ingest. A render of some of a budget's nodes gives them at most what the
  current documents of its other nodes leave of the budget, so the documents' shares never sum above it (a node
  grows into room another one gave back in an earlier document).

Trimming stays the agent's (leaf-first, never forced: ``agent.datapath.maintenance``); this module only moves bytes of
budget between nodes. Sizes are bytes.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

#: Seconds of reports a plan looks at (agents report every 10 s by default).
WINDOW_SECONDS = 120
#: Most reports of one node and cache scope a plan reads from the window (the newest): agents report every 10 s, 12
#: in the window; one that reports more often is judged (trimmed, writing) on its newest ones.
WINDOW_ROWS = 30
#: How far back a silent node's last report is looked for (raw samples are kept an hour).
SILENT_LOOKBACK_SECONDS = 3600
#: The floor of a node: this fraction of its writer-proportional share.
FLOOR_FRACTION = 0.1
#: A node holding at least this fraction of its share is at its share (the agent trims to the whole-block amount at or
#: above 90 % of it, ``agent.datapath.maintenance.BUDGET_LOW_WATER``).
PRESSED = 0.95
#: A node under its share keeps what it holds plus this fraction; it gives the rest back.
HEADROOM = 0.15
#: A plan replaces the current shares only when a share moves by more than this fraction of it.
HYSTERESIS = 0.1


def static_share(budget: int, node_writers: int, all_writers: int) -> int:
    """The writer-proportional share: ``budget * node_writers // all_writers`` bytes (0 without writers)."""
    if node_writers <= 0 or all_writers <= 0 or budget <= 0:
        return 0
    return budget * min(node_writers, all_writers) // all_writers


@dataclass(frozen=True)
class NodeDemand:
    """One node's side of a budget.

    ``writers``: its writer instances of the release; ``used_bytes``: what it holds of the budget's scopes (its
    newest report; None: never reported); ``silent``: no report within ``WINDOW_SECONDS``; ``trimmed``: its agent
    removed blocks of the budget's scopes over a budget within the window; ``writing``: it stored blocks of them
    within the window; ``current``: its share in its current document (None: none yet).
    """

    writers: int
    used_bytes: int | None = None
    silent: bool = True
    trimmed: bool = False
    current: int | None = None
    writing: bool = True


def _split(total: int, weights: Mapping[Any, float]) -> dict[Any, int]:
    """``total`` bytes in proportion to ``weights`` (all > 0), summing exactly to ``total`` (largest remainders)."""
    mass = sum(weights.values())
    exact = {n: total * w / mass for n, w in weights.items()}
    out = {n: int(v) for n, v in exact.items()}
    left = total - sum(out.values())
    for n in sorted(exact, key=lambda n: (out[n] - exact[n], n))[:left]:
        out[n] += 1
    return out


def plan_shares(budget: int, demand: Mapping[str, NodeDemand]) -> dict[str, int]:
    """Each node's share of ``budget`` bytes (see the module docstring); the shares sum to ``budget`` (0 for nodes
    without writers, which are left out of the split).

    Raises:
        ValueError: a negative budget.
    """
    if budget < 0:
        raise ValueError(f"budget must not be negative, got {budget}")
    all_writers = sum(max(0, d.writers) for d in demand.values())
    static = {n: static_share(budget, d.writers, all_writers) for n, d in demand.items()}
    writing = {n: d for n, d in demand.items() if d.writers > 0}
    if not writing or budget == 0:
        return static
    current = {n: d.current if d.current is not None else static[n] for n, d in writing.items()}
    current_fits = all(d.current is not None for d in writing.values()) and sum(current.values()) <= budget
    if not current_fits:  # a new or changed budget: measured against the writer split
        current = {n: static[n] for n in writing}
    if all(d.silent and d.used_bytes is None for d in writing.values()):  # nobody ever reported
        return {**static, **current} if current_fits else static
    floors = {n: int(static[n] * FLOOR_FRACTION) for n in writing}
    fixed: dict[str, int] = {}
    pressed: dict[str, float] = {}
    for n, d in writing.items():
        used = d.used_bytes or 0
        if d.silent:  # keeps what it last held (still in the Store), never more than it had; the rest is lent
            fixed[n] = max(floors[n], min(used, current[n]))
        elif d.trimmed or (d.writing and used >= PRESSED * current[n]):  # one that stopped writing needs no more
            pressed[n] = float(max(_pressed_weight(used, current[n], d.trimmed, current_fits), floors[n], 1))
        else:
            fixed[n] = max(floors[n], math.ceil(used * (1 + HEADROOM)) if d.writing else used)
    _fit(fixed, floors, budget - sum(floors[n] for n in pressed))
    rest = budget - sum(fixed.values())
    if pressed:
        share = _split(rest, pressed)
        plan = {**fixed, **share}
    else:  # nobody needs more: what is left goes back to the reporting nodes in proportion to what they keep
        reporting = {n: float(fixed[n] or 1) for n, d in writing.items() if not d.silent} or \
            {n: float(fixed[n] or 1) for n in writing}
        extra = _split(rest, reporting)
        plan = {n: fixed[n] + extra.get(n, 0) for n in writing}
    if current_fits and sum(current.values()) >= (1 - HYSTERESIS) * budget and all(
            abs(plan[n] - current[n]) <= HYSTERESIS * max(current[n], floors[n], 1) for n in writing):
        plan = current
    return {**static, **plan}


def _pressed_weight(used: int, current: int, trimmed: bool, current_fits: bool) -> int:
    """What a pressed node counts for in the split of what is left (bytes).

    While the current shares are the ones in effect (``current_fits``), a node holds more than its share only until
    its agent's next trim: a report taken before or during that trim shows blocks about to go, one taken after it
    what the trim left (down to ``BUDGET_LOW_WATER`` of the share). Weighted by those holdings, two nodes trimmed at
    the same moment would move bytes from the one whose report came after its trim to the one whose report came
    before it, and the loser trims again. So a node trimmed in the window counts for its current share (it was held
    at it), another pressed one for what it holds up to its current share. A new or changed budget
    (``current_fits`` false) is split by what the nodes hold: their demand as written.
    """
    if not current_fits:
        return used
    return current if trimmed else min(used, current)


def _fit(fixed: dict[Any, int], floors: Mapping[Any, int], room: int) -> None:
    """Shrink ``fixed`` (in place) toward its floors, in proportion to what each has above its floor, until it sums
    to at most ``room``."""
    excess = sum(fixed.values()) - room
    above = {n: fixed[n] - floors[n] for n in fixed if fixed[n] > floors[n]}
    if excess <= 0 or not above:
        return
    cut = _split(min(excess, sum(above.values())), {n: float(v) for n, v in above.items()})
    for n, c in cut.items():
        fixed[n] -= min(c, above[n])


# --- the registry and the reports ------------------------------------------------------------------------------

#: A budget's key: (release id, request group name, or None for the release's own budget).
BudgetKey = tuple[int, str | None]


@dataclass
class _Held:
    """What one node reported of one cache scope within the window."""

    ts: datetime
    bytes: int
    recent: bool = True
    trimmed: bool = False
    wrote: bool = False
    last_evicted: int = 0
    last_puts: int = 0


@dataclass
class ShareBook:
    """Shares of the budgets of some releases for one render (:meth:`load`); :meth:`share` answers per node.

    Budgets of a release with writers on a single node are not planned: that node's share is the whole budget.
    """

    writers_on_node: Mapping[tuple[int, int], int]
    rendered: frozenset[int] = frozenset()
    node_names: Mapping[int, str] = field(default_factory=dict)
    releases: Mapping[int, tuple[str, str, str]] = field(default_factory=dict)
    held: Mapping[tuple[str, tuple[str, str, str], str], _Held] = field(default_factory=dict)
    documents: Mapping[tuple[str, tuple[str, str, str], str | None], int] = field(default_factory=dict)
    _plans: dict[tuple[BudgetKey, int], dict[int, int]] = field(default_factory=dict)
    _writers: dict[int, dict[int, int]] = field(default_factory=dict)  # release id -> node id -> writers
    _held_by: dict[tuple[str, tuple[str, str, str]], list[tuple[str, _Held]]] = field(default_factory=dict)

    @classmethod
    def load(cls, writers_on_node: Mapping[tuple[int, int], int], rendered: Iterable[int],
             now: datetime | None = None) -> ShareBook:
        """Read what plans need for the releases of ``writers_on_node`` ((node id, release id) -> writer instances,
        every node) that have writers on two or more nodes: node names, the releases' cache-scope identities, the
        nodes' raw occupancy samples of those releases (``WINDOW_SECONDS``, a silent node's newest within
        ``SILENT_LOOKBACK_SECONDS``) and, when some node reported, the shares in the nodes' current documents.
        ``rendered``: ids of the nodes being rendered."""
        from django.db.models import F, Window
        from django.db.models.functions import RowNumber
        from django.utils import timezone

        from dashboard.models import ConfigVersion, NodeState, OccupancySample
        from tenants.models import Node, Release

        now = now or timezone.now()
        nodes_of: dict[int, set[int]] = {}
        for (node_id, release_id), n in writers_on_node.items():
            if n > 0:
                nodes_of.setdefault(release_id, set()).add(node_id)
        multi = {r for r, ids in nodes_of.items() if len(ids) > 1}
        book = cls(writers_on_node, frozenset(rendered))
        if not multi:
            return book
        node_ids = set().union(*(nodes_of[r] for r in multi))
        book.node_names = dict(Node.objects.filter(pk__in=node_ids).values_list("pk", "name"))
        book.releases = {pk: (tenant_id, served_model_name, namespace) for pk, tenant_id, served_model_name, namespace
                         in Release.objects.filter(pk__in=multi).values_list(
                             "pk", "model__tenant__tenant_id", "model__served_model_name", "namespace")}
        names = list(book.node_names.values())
        scopes = set(book.releases.values())
        fields = ("node_name", "tenant_id", "served_model_name", "namespace", "request_group", "ts", "bytes",
                  "budget_evicted_blocks", "puts")
        base = OccupancySample.objects.filter(
            level=OccupancySample.Level.RAW, node_name__in=names, tenant_id__in={s[0] for s in scopes},
            namespace__in={s[2] for s in scopes})
        held: dict[tuple[str, tuple[str, str, str], str], _Held] = {}

        def newest(rows, count: int):
            """The newest ``count`` rows of each (node, scope, group) among ``rows``, oldest first."""
            ranked = rows.annotate(newest=Window(RowNumber(), partition_by=[F(name) for name in fields[:5]],
                                                 order_by=[F("ts").desc(), F("pk").desc()])).filter(newest__lte=count)
            return sorted(ranked.values_list(*fields), key=lambda row: row[5])

        # at most WINDOW_ROWS reports of each (node, scope, group): an agent sending reports far more often than
        # every WINDOW_SECONDS / WINDOW_ROWS seconds (they are not rate-limited) costs a render no more rows
        for row in newest(base.filter(ts__gte=now - timedelta(seconds=WINDOW_SECONDS)), WINDOW_ROWS):
            _add(held, scopes, row, trimming=True)
        reported = {node for node, _, _ in held}
        silent = [n for n in names if n not in reported]
        if silent:
            # only the newest row of each (node, scope, group) counts for a silent node (what it last held): one
            # row each, not every report of the lookback (an hour of them, more from an agent that flooded reports)
            older = base.filter(node_name__in=silent, ts__gte=now - timedelta(seconds=SILENT_LOOKBACK_SECONDS),
                                ts__lt=now - timedelta(seconds=WINDOW_SECONDS))
            for row in newest(older, 1):
                _add(held, scopes, row, trimming=False)
        if not held:  # nobody reported within the lookback: the writer split, no documents read
            book.releases = {}
            return book
        book.held = held
        desired = dict(NodeState.objects.filter(node_name__in=names).values_list("node_name", "desired_version"))
        versions = ConfigVersion.objects.filter(node_name__in=list(desired), version__in=set(desired.values()))
        documents: dict[tuple[str, tuple[str, str, str], str | None], int] = {}
        for node_name, version, document in versions.values_list("node_name", "version", "document"):
            if desired.get(node_name) == version:
                _document_shares(documents, node_name, document, scopes)
        book.documents = documents
        return book

    def share(self, node_id: int, release_id: int, group: str | None, budget: int | None) -> int | None:
        """This node's share of the release's budget (``group`` None) or of request group ``group``'s budget for
        this release (bytes; None = no budget stays None)."""
        if budget is None:
            return None
        if not self._writers:
            for (n, r), w in self.writers_on_node.items():
                if w > 0:
                    self._writers.setdefault(r, {})[n] = w
        writers = self._writers.get(release_id, {})
        if node_id not in writers:
            return 0
        if release_id not in self.releases:
            return static_share(budget, writers[node_id], sum(writers.values()))
        key = ((release_id, group), budget)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(release_id, group, budget, writers)
        return plan[node_id]

    def _plan(self, release_id: int, group: str | None, budget: int, writers: Mapping[int, int]) -> dict[int, int]:
        scope = self.releases[release_id]
        demand = {}
        if not self._held_by:  # (node, release scope) -> [(group, held)]: one pass, not one per plan and node
            for (node, held_scope, held_group), h in self.held.items():
                self._held_by.setdefault((node, held_scope), []).append((held_group, h))
        for node_id, w in writers.items():
            name = self.node_names.get(node_id, "")
            rows = [h for g, h in self._held_by.get((name, scope), ()) if group is None or g == group]
            recent = [h for h in rows if h.recent]
            demand[node_id] = NodeDemand(
                writers=w, used_bytes=sum(h.bytes for h in rows) if rows else None, silent=not recent,
                trimmed=any(h.trimmed for h in recent), current=self.documents.get((name, scope, group)),
                writing=any(h.wrote for h in recent))
        plan = {int(n): s for n, s in plan_shares(budget, {str(n): d for n, d in demand.items()}).items()}
        # nodes not rendered now keep their current documents: the rendered ones get at most what those leave, but
        # never less than their floors (current documents of a larger, former budget are about to be re-rendered:
        # every change of a budget re-renders all nodes of its release)
        others = [n for n in writers if n not in self.rendered]
        held = 0
        for n in others:
            current = demand[n].current
            held += current if current is not None else plan[n]
        if held > budget:
            held = sum(plan[n] for n in others)
        rendered = [n for n in writers if n in self.rendered]
        if sum(plan[n] for n in rendered) > budget - held:
            all_writers = sum(writers.values())
            floors = {n: int(static_share(budget, writers[n], all_writers) * FLOOR_FRACTION) for n in rendered}
            fitted = {n: plan[n] for n in rendered}
            _fit(fitted, floors, budget - held)
            plan = {**plan, **fitted}
        return plan


def _add(held: dict, scopes: set[tuple[str, str, str]], row: tuple, *, trimming: bool) -> None:
    """Fold one sample row (ascending ``ts``) into ``held``: newest bytes per (node, release scope, group); for rows
    of the window (``trimming``), whether ``budget_evicted_blocks`` and ``puts`` grew between two samples (a single
    sample in the window says neither: not trimmed, not writing)."""
    node, tenant, model, namespace, group, ts, size, evicted, puts = row
    scope = (tenant, model, namespace)
    if scope not in scopes:
        return
    key = (node, scope, group)
    before = held.get(key)
    trimmed = before is not None and trimming and (before.trimmed or evicted > before.last_evicted)
    wrote = before is not None and trimming and (before.wrote or puts > before.last_puts)
    held[key] = _Held(ts=ts, bytes=int(size), recent=trimming, trimmed=trimmed, wrote=wrote,
                      last_evicted=int(evicted), last_puts=int(puts))


def _document_shares(out: dict, node: str, document: Any, scopes: set[tuple[str, str, str]]) -> None:
    """The shares of ``scopes``' budgets in one node's document (untrusted shapes skipped)."""
    if not isinstance(document, dict):
        return
    for spec in document.get("instances") or []:
        if not isinstance(spec, dict):
            continue
        scope = (spec.get("tenant_id"), spec.get("served_model_name", ""), spec.get("namespace"))
        if scope not in scopes:
            continue
        if isinstance(spec.get("node_budget_bytes"), int):
            out[(node, scope, None)] = spec["node_budget_bytes"]
        for group in spec.get("request_groups") or []:
            if isinstance(group, dict) and isinstance(group.get("node_budget_bytes"), int):
                out[(node, scope, group.get("name"))] = group["node_budget_bytes"]
