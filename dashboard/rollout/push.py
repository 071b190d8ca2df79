"""Config documents: render from the registry, version, sign, send to ``agent.<node>``; drift per node.

* ``render_contents(nodes)`` — per node, the document (schema ``DOCUMENT_SCHEMA_VERSION``) without
  ``version``/``issued_at``/``signature``: store endpoints
  (``tenants.rendering.RenderTarget.from_settings().store_endpoints()``), the node's ``node_settings``
  (``kv_events_port``, ``store_mode`` and, on standalone-store nodes, the ``mooncake_client`` argv of
  ``tenants.rendering.render_store_client``) and one ``agent.contract.messages.InstanceSpec`` per
  ``InstanceAssignment`` of the node (release namespace, state, KV layout, hash algo + seed, ranks, the tenant's
  request groups with salts, budgets — this node's share of each (``budget_shares.ShareBook``: demand-weighted
  when several nodes write the release, else ``budget_share``) of the release's effective
  budget, its own or the implicit one (``dashboard.master.room``) — and its ``launch``:
  ``render_assignment(...).launch_form()``, the JSON form of ``launch_spec()``), ordered by port. Each document is
  validated once, whole, through the shared schema (``ensure_versions``), so the dashboard never sends what the
  agent would refuse as ``invalid``.
* ``ensure_versions(nodes)`` — in one transaction with the nodes' ``NodeState`` rows locked: a new
  ``ConfigVersion`` (version = counter + 1) only when the content changed (``content_digest``) or an agent
  reported running a version at/above the counter (``version_floor``). The content is canonically encoded once,
  member by member (``agent.contract.signing.encoded_members``): its digest, the document's digest, the stored
  JSON text and the signed delivery are joined from those bytes (``signing.joined``), never encoded again whole.
* ``send_many(pairs)`` — stamps each delivery's ``sent_at`` (the agent's freshness check), signs with each node's
  current ``signing_secret``, seals the signed document to the node
  (``agent.contract.sealing``: AES-256-GCM under a key derived from that secret) and publishes the Celery task
  ``agent.apply_config`` to ``agent.<node>`` (expires after ``KVPOOL_PUSH_EXPIRES_SECONDS``), all documents of
  one call in one Redis pipeline (kombu ``Producer.batch``; the task message built once and copied per node,
  ``dashboard.rollout.publish``).
* ``push_nodes(names)`` — ensure + send when new, or when the node's ack lags and the last send is older than
  ``KVPOOL_REPUSH_AFTER_SECONDS``; ``reconcile()`` does that for every registered node (periodic).
* ``drift(state)`` — behind / silent / digest mismatch flags.
"""
from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from agent.contract import signing
from agent.contract.messages import (
    APPLY_CONFIG_TASK,
    DASHBOARD_READS,
    DOCUMENT_SCHEMA_VERSION,
    KVLayout,
    LoraAdapterSpec,
    NodeSettings,
    Ranks,
    node_queue,
)
from agent.contract.sealing import seal_bytes
from dashboard.models import ConfigVersion, NodeState
from dashboard.rollout.budget_shares import ShareBook

if TYPE_CHECKING:
    from tenants.models import RequestGroup

log = logging.getLogger("kvpool.dashboard.push")

#: Members of a document that are not its content (excluded from ``content_digest``).
VOLATILE_FIELDS = ("version", "issued_at", "signature")


def _render_target():
    from tenants.rendering import RenderTarget

    return RenderTarget.from_settings()


def _node_settings(node, target, metrics_urls: tuple[str, ...] | None = None) -> NodeSettings:
    """What the node's agent runs for its engines: the KV-events port, the store mode, in standalone-store
    mode the ``mooncake_client`` command line (``tenants.rendering.render_store_client``), and the masters'
    ``/metrics`` URLs whose eviction counters it polls (:func:`master_metrics_urls`; read now when not given)."""
    from tenants.rendering import render_store_client

    client = render_store_client(node, target)
    return NodeSettings(kv_events_port=node.kv_events_port, store_mode=node.store_mode,
                        store_client_argv=tuple(client.argv) if client is not None else None,
                        master_metrics_urls=master_metrics_urls(target) if metrics_urls is None else metrics_urls)


def master_metrics_urls(target) -> tuple[str, ...]:
    """The ``/metrics`` URLs of the Store masters, read from the settings the dashboard's master probe reads
    (``dashboard.master.health``): every master's admin URL in HA mode (``KVPOOL_MASTER_HA_ADMIN_URLS``; only the
    leader evicts, a standby's counters stay), else the render target's ``admin_url`` (``KVPOOL_MASTER_ADMIN_URL``)."""
    from tenants.masters import MasterTopology, ha_configured

    admin_urls: tuple[str, ...] = (target.admin_url,)
    if ha_configured():
        try:
            admin_urls = MasterTopology.from_settings().admin_urls
        except ValueError:  # misconfigured HA: the configuration checks name it; the agent polls the one URL
            pass
    return tuple(url.rstrip("/") + "/metrics" for url in admin_urls if url)


def _launch(assignment, target) -> dict[str, Any]:
    """The instance's launch relative to its instance directory in JSON form (``RenderedConfig.launch_form()``:
    validated once, with the whole document, by ``ensure_versions``)."""
    from tenants.rendering import render_assignment

    return render_assignment(assignment, target).launch_form()


#: Instance roles that write KV blocks into the Store (a ``decode`` instance only loads them).
WRITER_ROLES = frozenset({"prefill", "both"})


def budget_share(budget: int | None, node_writers: int, all_writers: int) -> int | None:
    """This node's share of a release's or request group's ``budget`` (bytes; None = no budget stays None):
    ``budget * node_writers // all_writers``, where ``node_writers`` are the node's writer instances (role
    ``prefill`` or ``both``) of the release and ``all_writers`` those of every node. Integer bytes, rounded
    down, so the shares of all nodes sum to at most ``budget``; 0 when the node writes nothing of the release
    (or nobody does). Each agent holds only its own writes under its share (``agent.node.engines``)."""
    if budget is None:
        return None
    if node_writers <= 0 or all_writers <= 0:
        return 0
    return budget * min(node_writers, all_writers) // all_writers


def _release_budgets() -> dict:
    """Implicit budgets of every live release without a budget (``dashboard.master.room.release_budgets``)."""
    from dashboard.master.room import current_pool_room, release_budgets

    return release_budgets(current_pool_room())


def _writer_counts(assignments) -> tuple[dict[int, int], dict[tuple[int, int], int]]:
    """Writer instances per release id, over every node, and per (node id, release id), of the releases of
    ``assignments`` (one query)."""
    from django.db.models import Count

    from tenants.models import InstanceAssignment

    release_ids = {a.release_id for a in assignments}
    per_release: dict[int, int] = {}
    per_node: dict[tuple[int, int], int] = {}
    rows = (InstanceAssignment.objects.filter(release_id__in=release_ids, role__in=WRITER_ROLES)
            .values("node_id", "release_id").annotate(n=Count("pk")))
    for row in rows:
        per_node[(row["node_id"], row["release_id"])] = row["n"]
        per_release[row["release_id"]] = per_release.get(row["release_id"], 0) + row["n"]
    return per_release, per_node


def _release_fields(release) -> dict[str, Any]:
    """The members of an ``InstanceSpec`` (JSON form) that every instance of ``release`` shares: tenant, served
    model, release, KV layout and hash (see :func:`_instance`; the budgets are each node's own)."""
    model = release.model
    tenant = model.tenant
    kv_layout = KVLayout(
        num_layers=release.num_layers, num_kv_heads=release.num_kv_heads, head_dim=release.head_dim,
        block_size=release.block_size, kv_dtype=release.kv_dtype, quantization=release.quantization,
        adapters=[LoraAdapterSpec(name=a.name, path=a.path or "")
                  for a in sorted(release.lora_adapters, key=lambda a: a.name)],
        weights_revision=release.weights_revision,
    )
    return {
        "engine": release.engine,
        "engine_version": release.engine_version,
        "tenant_id": tenant.tenant_id,
        "tenant_quota_bytes": tenant.quota_bytes,
        "served_model_name": model.served_model_name,
        "model_path": model.model_path,
        "vllm_model_name": model.vllm_model_name,
        "namespace": release.namespace,
        "release_state": release.state,
        "release_fingerprint": release.fingerprint,
        "kv_layout": kv_layout.model_dump(mode="json"),
        "hash_algo": release.hash_algo,
        "hash_seed": release.hash_seed,
    }


def _budget_fields(assignment, groups: Iterable[RequestGroup], budget: int | None, node_writers: int,
                   all_writers: int, shares: ShareBook | None) -> dict[str, Any]:
    """The node's shares of the release's effective ``budget`` and of each request group's budget, as the
    ``request_groups`` and ``node_budget_bytes`` members of an ``InstanceSpec`` (JSON form): demand-weighted from
    ``shares`` (``dashboard.rollout.budget_shares``), else by writer counts (``budget_share``)."""
    release_id = assignment.release_id

    def share(value: int | None, group: str | None = None) -> int | None:
        if shares is None:
            return budget_share(value, node_writers, all_writers)
        return shares.share(assignment.node_id, release_id, group, value)

    return {
        "request_groups": [{"name": g.name, "cache_salt": g.cache_salt,  # RequestGroupSpec's fields, in its order
                            "node_budget_bytes": share(g.budget_bytes, g.name)} for g in groups],
        "node_budget_bytes": share(budget),
    }


def _assignment_fields(assignment) -> dict[str, Any]:
    """The members of an ``InstanceSpec`` (JSON form) that are the assignment's own: id, role, port, ranks."""
    return {
        "instance_id": str(assignment.pk),
        "role": assignment.role,
        "port": assignment.port,
        "ranks": Ranks(
            tp_rank=assignment.tp_rank, tp_size=assignment.tp_size, pp_rank=assignment.pp_rank,
            pp_size=assignment.pp_size, pcp_rank=assignment.pcp_rank, pcp_size=assignment.pcp_size,
            dcp_rank=assignment.dcp_rank, dcp_size=assignment.dcp_size,
        ).model_dump(mode="json"),
    }


def _instance(assignment, groups: Iterable[RequestGroup], node_writers: int = 1, all_writers: int = 1,
              budgets: dict | None = None, shared: dict | None = None,
              shares: ShareBook | None = None) -> dict[str, Any]:
    """The instance's spec in JSON form (an ``InstanceSpec`` without its ``launch``); ``node_budget_bytes`` is the
    node's share of the release's effective budget: its own, or the implicit one of a live release without a
    budget (``dashboard.master.room.effective_budget``; ``budgets`` from ``release_budgets``, read now when not
    given). ``groups`` are the tenant's ``tenants.models.RequestGroup`` rows; each becomes a ``RequestGroupSpec``
    with the node's share of the group's ``budget_bytes``. Shares come from ``shares`` (demand-weighted,
    ``dashboard.rollout.budget_shares``), else ``budget_share``. ``shared`` (a dict the caller keeps for one render)
    holds what many nodes share, rendered once: the release-level members and effective budget per release, and
    the writer-count budget members per release and writer counts."""
    from dashboard.master.room import effective_budget

    shared = {} if shared is None else shared
    release_id = assignment.release_id
    if release_id not in shared:
        release = assignment.release
        shared[release_id] = (_release_fields(release), effective_budget(release, budgets).budget_bytes)
    fields, budget = shared[release_id]
    if shares is None:
        key = (release_id, node_writers, all_writers)
        if key not in shared:
            shared[key] = _budget_fields(assignment, groups, budget, node_writers, all_writers, None)
        budget_members = shared[key]
    else:
        budget_members = _budget_fields(assignment, groups, budget, node_writers, all_writers, shares)
    return {**fields, **budget_members, **_assignment_fields(assignment)}


def render_contents(nodes) -> dict[str, dict[str, Any]]:
    """Document contents of ``nodes`` (``tenants.models.Node``), keyed by node name.

    Each content is a JSON-ready dict without version, issued_at or signature; instances are ordered by port.
    Raises pydantic's ``ValidationError`` only if the registry holds something the schema refuses (a bug).
    """
    from tenants.models import InstanceAssignment, Release, RequestGroup

    nodes = list(nodes)
    by_node: dict[int, list] = {node.pk: [] for node in nodes}
    node_of = {node.pk: node for node in nodes}
    assignments = list(InstanceAssignment.objects.filter(node__in=nodes).order_by("node_id", "port", "pk"))
    # one Release (with its model and tenant) per release, shared by its instances: a join would build them per row
    releases = Release.objects.select_related("model__tenant").in_bulk({a.release_id for a in assignments})
    for assignment in assignments:
        assignment.node, assignment.release = node_of[assignment.node_id], releases[assignment.release_id]
        by_node[assignment.node_id].append(assignment)
    tenant_pks = {a.release.model.tenant_id for items in by_node.values() for a in items}
    groups: dict[int, list[RequestGroup]] = {pk: [] for pk in tenant_pks}
    for group in RequestGroup.objects.filter(tenant_id__in=tenant_pks).order_by("name"):
        groups[group.tenant_id].append(group)
    writers, writers_on_node = _writer_counts([a for items in by_node.values() for a in items])
    shares = ShareBook.load(writers_on_node, by_node)
    budgets = _release_budgets() if any(by_node.values()) else {}
    target = _render_target()
    store = target.store_endpoints().model_dump(mode="json")
    metrics_urls = master_metrics_urls(target)
    # What many nodes share is rendered once (``_instance``'s ``shared``): the release-level members of an instance,
    # per release and writer counts. The assignment's own members and its launch are rendered per instance; the
    # whole document is validated by ensure_versions.
    shared: dict[Any, Any] = {}
    dashboard_reads = list(DASHBOARD_READS)
    node_settings: dict[NodeSettings, dict[str, Any]] = {}

    def settings_of(node) -> dict[str, Any]:  # one JSON form (one object) for the nodes whose settings are equal
        value = _node_settings(node, target, metrics_urls)
        return node_settings.setdefault(value, value.model_dump(mode="json"))

    return {
        node.name: {
            "schema": DOCUMENT_SCHEMA_VERSION, "kind": "config", "node": node.name, "store": store,
            "instances": [{**_instance(a, groups[a.release.model.tenant_id],
                                       writers_on_node.get((node.pk, a.release_id), 0),
                                       writers.get(a.release_id, 0), budgets, shared, shares),
                           "launch": _launch(a, target)} for a in by_node[node.pk]],
            "node_settings": settings_of(node),
            "dashboard_reads": dashboard_reads,
        }
        for node in nodes
    }


def render_content(node) -> dict[str, Any]:
    """The document content of one node (see ``render_contents``)."""
    return render_contents([node])[node.name]


def content_digest(content: dict[str, Any]) -> str:
    """SHA-256 hex of the canonical document without its volatile members."""
    return signing.digest({k: v for k, v in content.items() if k not in VOLATILE_FIELDS})


#: Attribute of a ``ConfigVersion`` created by ``ensure_versions`` in this process: its document's members, each
#: canonically encoded (``agent.contract.signing.encoded_members``), so ``send_many`` signs it without encoding
#: the whole document again (a version read from the database has none: its document is encoded then).
ENCODED_MEMBERS = "_kvpool_encoded_members"


def _members_digest(members: dict[str, bytes]) -> str:
    """SHA-256 hex of the canonical encoding of the document with these encoded members (``signing.digest``)."""
    return hashlib.sha256(signing.joined(members)).hexdigest()


def _issued_at(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class _SharedMembers:
    """``signing.encoded_members`` for the contents of one render: a member whose value is the very object another
    content already had (what ``render_contents`` renders once for many nodes: the store endpoints, the node
    settings of nodes configured alike, the list of what the dashboard reads) is encoded once. Values are told
    apart by identity while ``render_contents``' result keeps them all alive."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int], bytes] = {}

    def encode(self, content: dict[str, Any]) -> dict[str, bytes]:
        """The members of ``content`` encoded as ``signing.encoded_members`` encodes them."""
        members: dict[str, bytes] = {}
        for key, value in content.items():
            seen = self._seen.get((key, id(value)))
            if seen is None:
                seen = self._seen[(key, id(value))] = signing.encoded_members({key: value})[key]
            members[key] = seen
        return members


@dataclass
class Ensured:
    """Outcome of ``ensure_versions`` for one node: its newest version, whether it was just created, and its
    state (ack and push fields as they were when the version was ensured)."""

    version: ConfigVersion
    created: bool
    state: NodeState


def ensure_versions(nodes) -> dict[str, Ensured]:
    """Make sure the newest ``ConfigVersion`` of each node matches the registry; see the module docstring.

    One transaction: the nodes' ``NodeState`` rows are locked (``NodeState.objects.lock_in_name_order``: in
    name order, so concurrent calls cannot deadlock; rows of nodes never pushed before are created first), the
    contents rendered under the lock (a concurrent push that renders later also versions later), new versions
    created in one multi-row INSERT and the desired version/digest of their nodes set in one pipelined batch of
    UPDATEs (``NodeState.objects.save_fields``). Raises ``MessageError``
    if a rendered document would not pass the agent's schema (nothing is created then).
    """
    from agent.contract.messages import parse_document

    nodes = sorted(nodes, key=lambda node: node.name)
    names = [node.name for node in nodes]
    if not nodes:
        return {}
    with transaction.atomic():
        states = NodeState.objects.lock_in_name_order(names)
        contents = render_contents(nodes)
        latest = _latest_versions(states)
        result: dict[str, Ensured] = {}
        created: list[ConfigVersion] = []
        issued_at = _issued_at(timezone.now())
        shared_members = _SharedMembers()
        for name in names:
            state, content = states[name], contents[name]
            # the content is encoded once: its digest, the document's digest and the signed delivery are joined
            # from its members' encodings (signing.joined), each the bytes signing.canonical_bytes would give
            members = shared_members.encode({k: v for k, v in content.items() if k not in VOLATILE_FIELDS})
            cdigest = _members_digest(members)
            current = latest.get(name)
            if (current is not None and current.content_digest == cdigest
                    and state.version_floor < state.desired_version):
                result[name] = Ensured(current, False, state)
                continue
            number = max(state.desired_version, state.version_floor) + 1
            document = {**content, "version": number, "issued_at": issued_at}
            parse_document(document)  # the agent would refuse it otherwise: fail here, loudly
            members.update(signing.encoded_members({"version": number, "issued_at": issued_at}))
            version = ConfigVersion(node_name=name, version=number, digest=_members_digest(members),
                                    content_digest=cdigest, document=document)
            setattr(version, ENCODED_MEMBERS, members)
            created.append(version)
            state.desired_version, state.desired_digest = number, version.digest
            result[name] = Ensured(version, True, state)
        _load_documents([item.version for item in result.values() if not item.created])
        if created:
            _insert_versions(created)
            NodeState.objects.save_fields((states[v.node_name] for v in created),
                                          ["desired_version", "desired_digest"])
    _log_created(created)
    return result


#: New versions of one ``ensure_versions`` call logged a line each at INFO; past this, one INFO line sums them up
#: (each node's line at DEBUG): a fleet push wrote 1,000 lines, about a sixth of its CPU per document.
LOG_EACH_VERSION_UP_TO = 20


def _log_created(created: list[ConfigVersion]) -> None:
    """Log the versions ``ensure_versions`` created (see ``LOG_EACH_VERSION_UP_TO``)."""
    each = log.info if len(created) <= LOG_EACH_VERSION_UP_TO else log.debug
    if len(created) > LOG_EACH_VERSION_UP_TO:
        numbers = [version.version for version in created]
        log.info("config versions %d..%d for %d nodes (%s … %s)", min(numbers), max(numbers), len(created),
                 created[0].node_name, created[-1].node_name)
    if each is log.debug and not log.isEnabledFor(logging.DEBUG):
        return
    for version in created:
        each("node %s: config version %d (digest %s, %d instances)", version.node_name, version.version,
             version.digest[:12], len(version.document["instances"]))


def _latest_versions(states: dict[str, NodeState]) -> dict[str, ConfigVersion]:
    """The desired ``ConfigVersion`` of each node (by name) that has one, without its document (one query; the
    content digest decides whether it stays, :func:`_load_documents` reads the documents of those that do)."""
    latest: dict[str, ConfigVersion] = {}
    for version in ConfigVersion.objects.filter(
            node_name__in=list(states), version__in={state.desired_version for state in states.values()}
    ).defer("document"):
        if states[version.node_name].desired_version == version.version:
            latest[version.node_name] = version
    return latest


def _load_documents(versions: list[ConfigVersion]) -> None:
    """Fill in the ``document`` of ``versions`` loaded without it (one query, none when there are none)."""
    if not versions:
        return
    documents = dict(ConfigVersion.objects.filter(pk__in=[v.pk for v in versions]).values_list("pk", "document"))
    for version in versions:
        version.document = documents[version.pk]


def ensure_version(node) -> Ensured:
    """``ensure_versions`` for one node."""
    return ensure_versions([node])[node.name]


_VERSION_COLUMNS = ("node_name", "version", "digest", "content_digest", "document", "created_at")


def _db_value(version: ConfigVersion, field) -> Any:
    """The database value of ``version``'s ``field``; the document as its canonical JSON text when its members were
    encoded here (``ENCODED_MEMBERS``): a ``jsonb`` (PostgreSQL) or text (SQLite) column reads the same value back,
    and neither the JSON encoder nor psycopg's Python JSON adapter runs again over the whole document."""
    members = getattr(version, ENCODED_MEMBERS, None) if field.attname == "document" else None
    if members is not None:
        return signing.joined(members).decode("utf-8")
    return field.get_db_prep_save(getattr(version, field.attname), connection)


#: Rows per INSERT of new versions: 6 parameters a row stay far below PostgreSQL's 65,535 bound parameters.
INSERT_ROWS = 1000


def _insert_versions(versions: list[ConfigVersion]) -> None:
    """INSERT new ``ConfigVersion`` rows (one per node) with multi-row ``VALUES`` statements (``INSERT_ROWS`` rows
    each); sets their pks.

    ``bulk_create`` would do the same, but on PostgreSQL Django 5.2 sends many rows as ``UNNEST`` arrays, which
    psycopg's client-side binding escapes element by element in Python: ~0.4 ms per 1 KiB document. On PostgreSQL
    the parameters are bound by the server (:func:`_bound_cursor`): the documents travel as they are, not quoted
    into the statement (about 7 % of a fleet push's CPU was psycopg building that statement).
    """
    quote = connection.ops.quote_name
    fields = [ConfigVersion._meta.get_field(name) for name in _VERSION_COLUMNS]
    now = timezone.now()
    for version in versions:
        version.created_at = now
    by_node = {version.node_name: version for version in versions}
    if connection.vendor == "postgresql":
        _insert_versions_from_arrays(versions, now, by_node)
        return
    with _bound_cursor() as cursor:
        for start in range(0, len(versions), INSERT_ROWS):
            chunk = versions[start:start + INSERT_ROWS]
            rows = ", ".join(["(" + ", ".join(["%s"] * len(fields)) + ")"] * len(chunk))
            params = [_db_value(version, field) for version in chunk for field in fields]
            cursor.execute(
                f"INSERT INTO {quote(ConfigVersion._meta.db_table)} ({', '.join(map(quote, _VERSION_COLUMNS))}) "
                f"VALUES {rows} RETURNING {quote(ConfigVersion._meta.pk.column)}, {quote('node_name')}", params)
            for pk, node_name in cursor.fetchall():  # RETURNING order is not guaranteed on SQLite: match by node
                version = by_node[node_name]
                version.pk = pk
                version._state.adding, version._state.db = False, connection.alias  # as bulk_create leaves them


def _document_text(version: ConfigVersion) -> str:
    """The document's JSON text: its canonical encoding when its members were encoded here (``ENCODED_MEMBERS``)."""
    members = getattr(version, ENCODED_MEMBERS, None)
    if members is not None:
        return signing.joined(members).decode("utf-8")
    return signing.canonical_bytes(version.document).decode("utf-8")


def _insert_versions_from_arrays(versions: list[ConfigVersion], now: datetime,
                                 by_node: dict[str, ConfigVersion]) -> None:
    """``_insert_versions`` on PostgreSQL: one ``INSERT ... SELECT FROM unnest(<one array per column>)`` per
    ``INSERT_ROWS`` rows, the arrays bound by the server in binary (``%b``: no quoting of any element, each document
    parsed once, as ``jsonb``). A multi-row ``VALUES`` of 6,000 placeholders cost psycopg a scan of the statement in
    Python per call (its cache holds statements of at most 50 parameters): an eighth of the dashboard worker's CPU
    in a 1,000-node push."""
    quote = connection.ops.quote_name
    table = quote(ConfigVersion._meta.db_table)
    columns = ", ".join(map(quote, _VERSION_COLUMNS))
    with _bound_cursor() as cursor:
        for start in range(0, len(versions), INSERT_ROWS):
            chunk = versions[start:start + INSERT_ROWS]
            cursor.execute(
                f"INSERT INTO {table} ({columns}) SELECT n, v, d, c, doc::jsonb, %s FROM unnest(%b::text[], "
                f"%b::bigint[], %b::text[], %b::text[], %b::text[]) AS r(n, v, d, c, doc) "
                f"RETURNING {quote(ConfigVersion._meta.pk.column)}, {quote('node_name')}",
                [now, [v.node_name for v in chunk], [v.version for v in chunk], [v.digest for v in chunk],
                 [v.content_digest for v in chunk], [_document_text(v) for v in chunk]])
            for pk, node_name in cursor.fetchall():
                version = by_node[node_name]
                version.pk = pk
                version._state.adding, version._state.db = False, connection.alias  # as bulk_create leaves them


def _bound_cursor():
    """A cursor of the default connection whose parameters the server binds on PostgreSQL (psycopg's ``Cursor``,
    Django's ``ServerBindingCursor``; the connection's own binds them client-side, quoting each value into the
    statement in Python), wrapped like Django's cursors (query logging, execute wrappers); elsewhere
    ``connection.cursor()``."""
    if connection.vendor != "postgresql":
        return connection.cursor()
    from django.db.backends.postgresql.base import ServerBindingCursor

    connection.ensure_connection()
    raw = ServerBindingCursor(connection.connection)
    return connection.make_debug_cursor(raw) if connection.queries_logged else connection.make_cursor(raw)


#: Node queues this process has declared on the broker. kombu remembers declarations per connection, and the
#: dashboard publishes through a pool of connections, so without this every pooled connection would declare
#: every node queue again (on Redis: an ``LLEN`` pipeline and a ``SADD`` per queue and connection).
_declared_queues: set[str] = set()


#: kombu's retry policy of a config document's publish (a batch the broker refused is also sent once more whole).
PUBLISH_RETRY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.5, "interval_max": 0.5}


def _publish_documents(documents: list[tuple[str, int, dict[str, Any]]]) -> None:
    """Publish ``(node name, version, sealed document)`` triples as ``agent.apply_config`` tasks to ``agent.<node>``
    (each document signed and then sealed to its node, ``agent.contract.sealing``: the queue holds no seed or salt).

    All of them go through one producer inside kombu's ``Producer.batch()`` (kombu >= 5.7): on Redis the
    ``LPUSH``es are buffered and sent as one pipeline when the batch closes, one round trip instead of one per
    node. The task messages are built once and copied per node (``dashboard.rollout.publish.TaskBatch``: what
    ``app.send_task`` would publish, at a fraction of its CPU). A queue is declared with the first document this
    process sends to it. The task's ``argsrepr`` (what monitoring and logs show) names the node and version
    instead of repeating the signed document.
    Raises when the broker did not take the batch (kombu's ``BatchPublishError`` when the pipeline failed:
    some documents may have been delivered, which is harmless, an agent acks a re-delivery again).
    """
    from dashboard.celery import app
    from dashboard.rollout.publish import TaskBatch

    with app.producer_or_acquire() as producer, producer.batch():
        batch = TaskBatch(app, producer, expires=settings.KVPOOL_PUSH_EXPIRES_SECONDS, retry_policy=PUBLISH_RETRY)
        for name, version, document in documents:
            queue = node_queue(name)
            batch.send(APPLY_CONFIG_TASK, args=[document], queue=queue,
                       declare=[] if queue in _declared_queues else None,
                       argsrepr=f"[<config document node={name} version={version}>]")
    _declared_queues.update(node_queue(name) for name, _, _ in documents)


def _record_push_errors(errors: dict[str, str]) -> None:
    """Keep each node's push error (node name -> message) in ``NodeState.push_error``, one UPDATE per message."""
    by_error: dict[str, list[str]] = {}
    for name, error in errors.items():
        by_error.setdefault(error[:2000], []).append(name)
    for error, names in by_error.items():
        NodeState.objects.filter(node_name__in=names).update(push_error=error)


def send_many(pairs) -> int:
    """Sign each ``(node, config_version)`` with the node's current ``signing_secret`` and publish it to
    ``agent.<node>`` (task ``agent.apply_config``, expiring after ``KVPOOL_PUSH_EXPIRES_SECONDS``).

    The documents are published together (``_publish_documents``: one Redis pipeline); when the broker does
    not take them the whole batch is tried once more. Returns how many the broker took. Failures are logged
    and kept in ``NodeState.push_error`` (the periodic reconcile sends again); successes set
    ``pushed_version``/``pushed_at`` (one UPDATE per distinct version).
    """
    errors: dict[str, str] = {}
    stamp = signing.encoded_members({signing.SENT_AT_FIELD: _issued_at(timezone.now())})
    documents: list[tuple[str, int, dict[str, Any]]] = []
    versions: dict[str, int] = {}
    for node, config_version in pairs:
        try:
            members = getattr(config_version, ENCODED_MEMBERS, None)
            if members is None:
                members = signing.encoded_members(config_version.document)
            # this delivery's freshness stamp, signed with the document (one canonical encoding, signing.joined)
            plaintext = signing.signed_payload(signing.joined({**members, **stamp}), node.signing_secret)
            documents.append((node.name, config_version.version,
                              seal_bytes(plaintext, node.signing_secret, node=node.name)))
        except ValueError as exc:  # an empty secret: nothing the agent could verify
            errors[node.name] = f"{type(exc).__name__}: {exc}"
            log.error("node %s: signing config version %d failed: %s", node.name, config_version.version, exc)
            continue
        versions[node.name] = config_version.version
    for attempt in (1, 2):
        if not documents:
            break
        try:
            _publish_documents(documents)
            break
        except Exception as exc:  # broker down: record, the reconcile task retries
            if attempt == 1:
                log.warning("pushing %d config documents failed (%s: %s); trying once more", len(documents),
                            type(exc).__name__, exc)
                continue
            for name, _, _ in documents:
                errors[name] = f"{type(exc).__name__}: {exc}"
                log.error("node %s: pushing config version %d failed: %s", name, versions.pop(name), exc)
    if errors:
        _record_push_errors(errors)
    if versions:
        now = timezone.now()
        by_version: dict[int, list[str]] = {}
        for name, version in versions.items():
            by_version.setdefault(version, []).append(name)
        for version, names in by_version.items():
            NodeState.objects.filter(node_name__in=names).update(pushed_version=version, pushed_at=now,
                                                                 push_error="")
    return len(versions)


def send(node, config_version: ConfigVersion) -> bool:
    """``send_many`` for one node; returns whether the broker took the document."""
    return send_many([(node, config_version)]) == 1


def push_nodes(names: Iterable[str], *, force: bool = False) -> dict[str, int]:
    """Ensure and send the documents of the named nodes; returns counts (``versions``, ``sent``, ``missing``,
    ``failed``).

    A document is sent when a new version was created, when ``force`` is set, or when the node's ack lags the
    desired version and the last send is older than ``KVPOOL_REPUSH_AFTER_SECONDS``. Names not in the
    registry are counted as ``missing`` (a deleted node has nothing to receive).
    """
    from tenants.models import Node

    names = sorted(set(names))
    nodes = {node.name: node for node in Node.objects.filter(name__in=names)}
    counts = {"versions": 0, "sent": 0, "missing": len(names) - len(nodes), "failed": 0}
    try:
        ensured = ensure_versions(nodes.values())
    except Exception:  # one node's document is broken: version the others one by one
        log.exception("versioning config documents of nodes %s together failed; retrying one by one", sorted(nodes))
        ensured = {}
        for name, node in nodes.items():
            try:
                ensured[name] = ensure_version(node)
            except Exception:
                counts["failed"] += 1
                log.exception("node %s: rendering its config document failed", name)
    repush_before = timezone.now() - timedelta(seconds=settings.KVPOOL_REPUSH_AFTER_SECONDS)
    to_send = []
    for name, item in ensured.items():
        state = item.state
        behind = state.acked_version < state.desired_version
        stale_push = (state.pushed_at is None or state.pushed_at < repush_before
                      or state.pushed_version < state.desired_version)
        if item.created or force or (behind and stale_push):
            to_send.append((nodes[name], item.version))
    counts["versions"] = sum(item.created for item in ensured.values())
    counts["sent"] = send_many(to_send)
    return counts


def reconcile() -> dict[str, int]:
    """``push_nodes`` for every registered node (catches changes no signal saw, e.g. ``QuerySet.update``)."""
    from tenants.models import Node

    totals = {"versions": 0, "sent": 0, "missing": 0, "failed": 0}
    names = list(Node.objects.order_by("name").values_list("name", flat=True))
    for start in range(0, len(names), 100):
        for key, value in push_nodes(names[start:start + 100]).items():
            totals[key] += value
    return totals


def drift(state: NodeState, now: datetime | None = None) -> dict[str, Any]:
    """Drift flags of one node.

    * ``behind`` — the acked version is below the desired one;
    * ``silent`` — no heartbeat within ``KVPOOL_HEARTBEAT_SILENCE_SECONDS`` (or never);
    * ``digest_mismatch`` — the agent reports running the desired version with another digest, or acked a
      version with a digest other than the one the dashboard stored for it;
    * ``rejected`` — the newest ack was a rejection of the desired version (``rejection_reason`` says why);
    * ``in_sync`` — none of the above.
    """
    now = now or timezone.now()
    silence = timedelta(seconds=settings.KVPOOL_HEARTBEAT_SILENCE_SECONDS)
    behind = state.acked_version < state.desired_version
    silent = state.heartbeat_at is None or now - state.heartbeat_at > silence
    mismatch = bool(
        (state.applied_version == state.desired_version and state.applied_digest
         and state.applied_digest != state.desired_digest)
        or (state.acked_version == state.desired_version and state.acked_digest
            and state.acked_digest != state.desired_digest)
    )
    rejected = state.rejected_version is not None and state.rejected_version == state.desired_version and behind
    age = (now - state.heartbeat_at).total_seconds() if state.heartbeat_at else None
    return {
        "behind": behind,
        "silent": silent,
        "digest_mismatch": mismatch,
        "rejected": rejected,
        "in_sync": not (behind or silent or mismatch),
        "heartbeat_age_seconds": age,
    }
