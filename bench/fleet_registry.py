"""A fleet-sized registry, built fast: tenants, served models, releases, request groups, nodes and instances.

    fleet = build_fleet(nodes=1000, tenants=50, models=200, releases=2000, scopes=10000, scopes_per_node=50)

The shape (defaults: the fleet of issue 17): ``tenants`` tenants with a quota each; ``models`` served models dealt
round-robin over the tenants; ``releases`` release namespaces (state ``serving``) dealt round-robin over the models;
each tenant gets ``scopes / releases`` request groups (rounded, at least 1), so that a release's instance carries that
many cache scopes (every instance of a tenant carries all of its request groups: ``dashboard.rollout.push``); and
``nodes * scopes_per_node / groups`` instances, the same number of replicas of each release on distinct nodes, dealt
so that a node runs about ``scopes_per_node / groups`` instances of different releases (mostly of different tenants).
A cache scope is ``(tenant_id, served_model_name, namespace, request_group)``.

Speed: each model's rows are created with one ``bulk_create`` per table instead of one ``save()`` each (10,000
``validated_save`` calls take minutes). The objects are still built through the real models: defaults (signing
secrets, cache salts, hash seeds), derived fields (``vllm_model_name``, ``fingerprint``, ``first_served_at``) and the
field rules (``clean_fields``) are the models' own; the cross-row rules ``clean()`` checks (unique names and
namespaces, salts, ports and GPUs per node, the placement caps of ``dashboard/settings.py``) hold by construction and
are checked up front against the settings (``ValueError`` when the shape cannot fit). The side rows a ``save()``
writes (``ReservedTenantId``) are written too. Not written: audit entries and config pushes (``bulk_create`` sends
no signals): the bench pushes the first documents itself.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction
from django.utils import timezone

#: One cache scope: (Mooncake tenant_id, served model name, release namespace, request group name).
Scope = tuple[str, str, str, str]

#: The KV layout and engine of every fleet release (a vLLM 0.33.0 Qwen3-8B-like model).
RELEASE_SETTINGS = {"num_layers": 36, "num_kv_heads": 8, "head_dim": 128, "block_size": 16, "engine": "vllm",
                    "engine_version": "0.33.0"}
#: Where the fleet's model paths lie (every node declares it as its model root).
MODEL_ROOT = "/models"
#: First engine HTTP port on a node; the k-th instance of a node listens on ``FIRST_PORT + k`` and holds GPU ``k``.
FIRST_PORT = 8000


@dataclass
class Fleet:
    """What ``build_fleet`` created, by name.

    ``node_names`` sorted; ``instances`` the number of instance assignments; ``secrets`` node name -> signing
    secret (what its agent signs with); ``tenant_ids``;
    ``models`` (tenant_id, served_model_name); ``releases`` (tenant_id, served_model_name, namespace); ``groups``
    (tenant_id, request group name); ``scopes`` every distinct cache scope (sorted); ``scopes_by_node`` node name ->
    the cache scopes its document carries (in port order, each once).
    """

    node_names: list[str]
    secrets: dict[str, str]
    tenant_ids: list[str]
    models: list[tuple[str, str]]
    releases: list[tuple[str, str, str]]
    groups: list[tuple[str, str]]
    scopes: list[Scope]
    scopes_by_node: dict[str, list[Scope]] = field(repr=False)
    instances: int = 0


@dataclass(frozen=True)
class FleetShape:
    """The counts ``build_fleet`` derives from its arguments (see the module docstring); ``placement[r]`` lists the
    node indexes of release ``r``'s instances."""

    groups_per_tenant: int
    replicas: int
    placement: list[list[int]]

    @classmethod
    def plan(cls, *, nodes: int, tenants: int, models: int, releases: int, scopes: int,
             scopes_per_node: int) -> FleetShape:
        """Derive and check the shape; raises ``ValueError`` naming the argument when it cannot be built (a count
        below 1, fewer models than tenants or releases than models, more replicas of a release than nodes, or a
        node/tenant cap of the settings)."""
        for name, value in (("nodes", nodes), ("tenants", tenants), ("models", models), ("releases", releases),
                            ("scopes", scopes), ("scopes_per_node", scopes_per_node)):
            if value < 1:
                raise ValueError(f"{name} must be at least 1 (got {value})")
        if models < tenants:
            raise ValueError(f"models ({models}) must be at least tenants ({tenants}): every tenant serves one")
        if releases < models:
            raise ValueError(f"releases ({releases}) must be at least models ({models}): every model has one")
        groups = max(1, round(scopes / releases))
        if groups > settings.KVPOOL_MAX_REQUEST_GROUPS_PER_TENANT:
            raise ValueError(f"scopes: {groups} request groups per tenant exceed "
                             f"KVPOOL_MAX_REQUEST_GROUPS_PER_TENANT ({settings.KVPOOL_MAX_REQUEST_GROUPS_PER_TENANT})")
        replicas = max(1, round(nodes * scopes_per_node / groups / releases))
        if replicas > nodes:
            raise ValueError(f"scopes_per_node: {scopes_per_node} needs {replicas} instances of each release, on "
                             f"distinct nodes, but there are {nodes} nodes")
        placement = [[(r * replicas + i) % nodes for i in range(replicas)] for r in range(releases)]
        per_node: dict[int, int] = {}
        per_tenant_node: dict[tuple[int, int], int] = {}
        for r, node_indexes in enumerate(placement):
            for n in node_indexes:
                per_node[n] = per_node.get(n, 0) + 1
                key = (r % models % tenants, n)
                per_tenant_node[key] = per_tenant_node.get(key, 0) + 1
        caps = (("instances per node", max(per_node.values()), settings.KVPOOL_MAX_INSTANCES_PER_NODE,
                 "KVPOOL_MAX_INSTANCES_PER_NODE"),
                ("instances of one tenant per node", max(per_tenant_node.values()),
                 settings.KVPOOL_MAX_INSTANCES_PER_TENANT_PER_NODE, "KVPOOL_MAX_INSTANCES_PER_TENANT_PER_NODE"),
                ("instances per tenant", -(-releases // tenants) * replicas, settings.KVPOOL_MAX_INSTANCES_PER_TENANT,
                 "KVPOOL_MAX_INSTANCES_PER_TENANT"))
        for what, count, cap, setting in caps:
            if count > cap:
                raise ValueError(f"scopes_per_node: {count} {what} exceed {setting} ({cap})")
        return cls(groups_per_tenant=groups, replicas=replicas, placement=placement)


def tenant_id_of(t: int) -> str:
    """Mooncake tenant id of the fleet's ``t``-th tenant."""
    return f"fleet-t{t:03d}"


def node_name_of(n: int) -> str:
    """Name of the fleet's ``n``-th node."""
    return f"fleet-n{n:04d}"


def _checked(objects: list) -> list:
    """``objects`` after each one's ``clean_fields()`` (the field rules; raises Django's ``ValidationError``).
    Foreign keys are left out: they point at rows just created (checking each would be one query)."""
    for obj in objects:
        obj.clean_fields(exclude=[f.name for f in obj._meta.concrete_fields if f.is_relation])
    return objects


def build_fleet(*, nodes: int = 1000, tenants: int = 50, models: int = 200, releases: int = 2000,
                scopes: int = 10_000, scopes_per_node: int = 50, seed: int = 0) -> Fleet:
    """Create the fleet registry in the current database (one transaction) and return its names.

    Model ``m`` belongs to tenant ``m % tenants``, release ``r`` to model ``r % models``. ``seed`` varies the
    hash seeds only (``PYTHONHASHSEED`` of release ``r`` is ``seed * releases + r``); names are deterministic.
    The registry must not already hold fleet names (the unique constraints refuse them). Raises ``ValueError``
    when the shape cannot be built (``FleetShape.plan``).
    """
    from tenants.models import InstanceAssignment, Node, Release, RequestGroup, ReservedTenantId, ServedModel, Tenant

    shape = FleetShape.plan(nodes=nodes, tenants=tenants, models=models, releases=releases, scopes=scopes,
                            scopes_per_node=scopes_per_node)
    now = timezone.now()
    with transaction.atomic():
        tenant_rows = Tenant.objects.bulk_create(_checked([
            Tenant(tenant_id=tenant_id_of(t), quota_bytes=(256 << 30) * (1 + t % 4), description="fleet bench")
            for t in range(tenants)]))
        ReservedTenantId.objects.bulk_create([ReservedTenantId(tenant_id=t.tenant_id, tenant_pk=t.pk)
                                              for t in tenant_rows])
        model_objs = []
        for m in range(models):
            model = ServedModel(tenant=tenant_rows[m % tenants], served_model_name=f"model-{m:04d}",
                                model_path=f"{MODEL_ROOT}/model-{m:04d}")
            model._derive_vllm_model_name()
            model_objs.append(model)
        model_rows = ServedModel.objects.bulk_create(_checked(model_objs))
        release_objs = []
        for r in range(releases):
            release = Release(model=model_rows[r % models], namespace=f"rel-{r:05d}", state="serving",
                              first_served_at=now, hash_seed=str(seed * releases + r), **RELEASE_SETTINGS)
            release.fingerprint = release.compute_fingerprint()
            release_objs.append(release)
        release_rows = Release.objects.bulk_create(_checked(release_objs))
        group_rows = RequestGroup.objects.bulk_create(_checked([
            RequestGroup(tenant=tenant, name=f"app-{g:03d}") for tenant in tenant_rows
            for g in range(shape.groups_per_tenant)]))
        node_rows = Node.objects.bulk_create(_checked([
            Node(name=node_name_of(n), hostname=f"10.{n // 65536 % 256}.{n // 256 % 256}.{n % 256}",
                 model_roots=[MODEL_ROOT]) for n in range(nodes)]))
        slots = [0] * nodes
        assignments = []
        for release, node_indexes in zip(release_rows, shape.placement, strict=True):
            for n in node_indexes:
                assignments.append(InstanceAssignment(node=node_rows[n], release=release, engine=release.engine,
                                                      port=FIRST_PORT + slots[n], gpu_ids=str(slots[n])))
                slots[n] += 1
        InstanceAssignment.objects.bulk_create(_checked(assignments))

    groups_of: dict[int, list[str]] = {}
    for group in group_rows:
        groups_of.setdefault(group.tenant_id, []).append(group.name)
    scopes_by_node: dict[str, list[Scope]] = {node.name: [] for node in node_rows}
    for assignment in assignments:  # in port order per node
        release = assignment.release
        model = release.model
        scopes_by_node[assignment.node.name] += [
            (model.tenant.tenant_id, model.served_model_name, release.namespace, name)
            for name in groups_of[model.tenant_id]]
    return Fleet(
        node_names=[node.name for node in node_rows],
        secrets={node.name: node.signing_secret for node in node_rows},
        tenant_ids=[tenant.tenant_id for tenant in tenant_rows],
        models=[(m.tenant.tenant_id, m.served_model_name) for m in model_rows],
        releases=[(r.model.tenant.tenant_id, r.model.served_model_name, r.namespace) for r in release_rows],
        groups=[(tenant_rows[i // shape.groups_per_tenant].tenant_id, g.name) for i, g in enumerate(group_rows)],
        scopes=sorted({scope for node_scopes in scopes_by_node.values() for scope in node_scopes}),
        scopes_by_node=scopes_by_node,
        instances=len(assignments),
    )
