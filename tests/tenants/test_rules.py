"""Every refused input of the registry models, with its message (the API and admin show the same)."""
from __future__ import annotations

import re

import pytest

from tenants.models import (
    InstanceAssignment,
    Node,
    Release,
    RequestGroup,
    ServedModel,
    Tenant,
)
from tests.support.factories import (
    RELEASE_DEFAULTS,
    make_assignment,
    make_group,
    make_model,
    make_node,
    make_release,
    make_tenant,
    refused,
)

pytestmark = pytest.mark.django_db


# --- tenant ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tenant_id", "message"),
    [
        ("", "This field cannot be blank."),
        ("_internal", "tenant_id must not start with '_' (Mooncake reserves those names)."),
        ("a\x00b", "tenant_id must not contain NUL characters."),
        ("a\tb", "tenant_id must not contain control or invisible characters (found U+0009)."),
        ("a\x7fb", "tenant_id must not contain control or invisible characters (found U+007F)."),
        ("a\u200bb", "tenant_id must not contain control or invisible characters (found U+200B)."),
        ("a\u2028b", "tenant_id must not contain control or invisible characters (found U+2028)."),
    ],
)
def test_tenant_id_refused(tenant_id, message):
    assert refused(Tenant(tenant_id=tenant_id, quota_bytes=1))["tenant_id"] == [message]


@pytest.mark.parametrize("tenant_id", ["acme", "acme corp/ü", "a:b", "-lead", "x_y", "A-B.C", "123", "default"])
def test_tenant_ids_the_master_accepts_are_accepted(tenant_id):
    Tenant(tenant_id=tenant_id, quota_bytes=1).full_clean()


def test_tenant_id_unique():
    make_tenant("acme")
    assert refused(Tenant(tenant_id="acme", quota_bytes=1))["tenant_id"] == ["A tenant with this tenant_id already exists."]


@pytest.mark.parametrize(
    ("quota", "message"),
    [(0, "Ensure this value is greater than or equal to 1."), (2**63, "Ensure this value is less than or equal to")],
)
def test_tenant_quota_range(quota, message):
    assert refused(Tenant(tenant_id="t", quota_bytes=quota))["quota_bytes"][0].startswith(message)


# --- served model ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("qwen 3", "served_model_name must not contain whitespace."),
        ("qwen@3", "served_model_name must not contain '@' (the separator of vLLM store keys)."),
        ("qwen\n3", "served_model_name must not contain control or invisible characters (found U+000A)."),
        ("", "This field cannot be blank."),
    ],
)
def test_served_model_name_refused(tenant, name, message):
    assert refused(ServedModel(tenant=tenant, served_model_name=name, model_path="Qwen/Qwen3-8B"))[
        "served_model_name"
    ] == [message]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/", "model_path '/' has no last path component, so vLLM derives an empty model name."),
        (
            "/models/Qwen@3",
            "model_path '/models/Qwen@3' gives the vLLM model name 'Qwen@3', which must not contain '@' or whitespace "
            "('@' separates the fields of vLLM store keys).",
        ),
        (
            "/models/Qwen 3",
            "model_path '/models/Qwen 3' gives the vLLM model name 'Qwen 3', which must not contain '@' or whitespace "
            "('@' separates the fields of vLLM store keys).",
        ),
        ("/models/\x01x", "model_path must not contain control or invisible characters (found U+0001)."),
        ("-Qwen3-8B", "model_path must not start with '-': the engines get it as a command-line argument, where it "
                      "would read as an option."),
        ("/models/Qwen3-8B/", "model_path '/models/Qwen3-8B/' must be written in normal form, '/models/Qwen3-8B' (no "
                              "'.', '..', '//' or trailing '/')."),
        ("/models/../etc/Qwen3-8B", "model_path '/models/../etc/Qwen3-8B' must be written in normal form, "
                                    "'/etc/Qwen3-8B' (no '.', '..', '//' or trailing '/')."),
        ("../Qwen3-8B", "model_path '../Qwen3-8B' is neither an absolute directory in normal form nor a hub id; give "
                        "an absolute directory such as '/models/Qwen3-8B' or a hub id such as 'Qwen/Qwen3-8B'."),
        ("~/Qwen3-8B", "model_path '~/Qwen3-8B' is neither an absolute directory in normal form nor a hub id; give "
                       "an absolute directory such as '/models/Qwen3-8B' or a hub id such as 'Qwen/Qwen3-8B'."),
    ],
)
def test_model_path_refused(tenant, path, message):
    assert refused(ServedModel(tenant=tenant, served_model_name="m", model_path=path))["model_path"] == [message]


@pytest.mark.parametrize(
    ("path", "vllm_name"),
    [("Qwen/Qwen3-8B", "Qwen3-8B"), ("/models/Qwen3-8B", "Qwen3-8B"), ("m", "m")],
)
def test_vllm_model_name_is_derived_and_stored(tenant, path, vllm_name):
    model = make_model(tenant, model_path=path)
    model.refresh_from_db()
    assert model.vllm_model_name == vllm_name


def test_served_model_name_unique_per_tenant(tenant):
    make_model(tenant, "qwen3-8b")
    message = refused(ServedModel(tenant=tenant, served_model_name="qwen3-8b", model_path="x/y"))["served_model_name"]
    assert message == ["Tenant 'acme' already has a served model named 'qwen3-8b'."]
    make_model(make_tenant("other"), "qwen3-8b")  # another tenant is another key space


def test_sglang_key_prefix_collision_refused(tenant):
    make_model(tenant, "org/model", model_path="org/model-a")
    message = refused(ServedModel(tenant=tenant, served_model_name="org-model", model_path="x/model-b"))
    assert message["served_model_name"] == [
        "served_model_name 'org-model' and served model 'org/model' give the same SGLang key prefix 'org-model' "
        "(SGLang replaces '/' by '-'), so their KV cache entries would mix. Choose a distinct name."
    ]


# --- release -----------------------------------------------------------------------------------------------


def _release(model, **overrides) -> Release:
    return Release(model=model, **{"namespace": "production-2026-07", **RELEASE_DEFAULTS, **overrides})


@pytest.mark.parametrize(
    ("namespace", "reason"),
    [
        ("prod_1", "must not contain '_' (SGLang joins extra_backend_tag and model name with '_')"),
        ("prod@1", "must not contain '@' (vLLM separates cache_prefix from the key with '@')"),
        ("prod 1", "must not contain whitespace"),
        ("Production", "must be lower case"),
        ("-prod", "must start and end with a letter or digit"),
        ("prod-", "must start and end with a letter or digit"),
        ("prod.1", "may contain only lower-case letters a-z, digits and '-' (no '.', so it is a literal in a regex)"),
        ("x" * 64, "must be at most 63 characters (has 64)"),
    ],
)
def test_release_namespace_refused(served_model, namespace, reason):
    errors = refused(_release(served_model, namespace=namespace))
    assert errors["namespace"][0] == (
        f"Release namespace '{namespace}' {reason}; it becomes SGLang extra_backend_tag and vLLM cache_prefix, "
        "e.g. 'production-2026-07'."
    )


@pytest.mark.parametrize("seed", ["007", "-1", "4294967296", "random", "1.0", " 1"])
def test_hash_seed_refused(served_model, seed):
    assert refused(_release(served_model, hash_seed=seed))["hash_seed"] == [
        f"hash_seed '{seed}' must be a decimal integer from 0 to 4294967295 without leading zeros "
        "(it is the PYTHONHASHSEED every instance of the release runs with)."
    ]


@pytest.mark.parametrize("seed", ["0", "4294967295", "42"])
def test_hash_seed_accepted(served_model, seed):
    _release(served_model, hash_seed=seed).full_clean()


def test_hash_seed_generated_once_and_kept(served_model):
    release = make_release(served_model)
    assert re.fullmatch(r"0|[1-9][0-9]*", release.hash_seed) and int(release.hash_seed) <= 4294967295
    seed = release.hash_seed
    release.refresh_from_db()
    release.description = "edited"
    release.full_clean()
    release.save()
    release.refresh_from_db()
    assert release.hash_seed == seed


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("engine_version", ".33", "'.33' must start with a letter or digit and contain only letters, digits, '.', '+', '_', '-'."),
        ("kv_dtype", "FP8", "Value 'FP8' is not a valid choice."),
        ("kv_dtype", "banana", "Value 'banana' is not a valid choice."),
        ("quantization", "awq q", "'awq q' must be lower case and contain only letters, digits, '_', '.', '-'."),
        ("weights_revision", "main branch", "This value must not contain whitespace."),
        ("adapters", "lora-a", 'adapters must be a list of LoRA adapters, each {"name": ..., "path": ...} (and '
         'optionally "rank").'),
        ("adapters", [{"name": "lora-a", "path": "/a"}, {"name": "lora-a", "path": "/b"}],
         "adapter 'lora-a' is listed twice."),
        ("adapters", [{"name": "lora a", "path": "/a"}], "adapter 'lora a' must not contain whitespace."),
        ("adapters", [{"name": "", "path": "/a"}], "each adapter needs a non-empty 'name' (the LoRA name requests ask for)."),
        ("num_layers", 0, "Ensure this value is greater than or equal to 1."),
        ("block_size", 0, "Ensure this value is greater than or equal to 1."),
        ("engine", "trt", "Value 'trt' is not a valid choice."),
        ("hash_algo", "md5", "Value 'md5' is not a valid choice."),
    ],
)
def test_release_settings_refused(served_model, field, value, message):
    assert refused(_release(served_model, **{field: value}))[field] == [message]


def test_sglang_requires_sha256(served_model):
    errors = refused(_release(served_model, engine="sglang", hash_algo="xxhash_cbor"))
    assert errors["hash_algo"] == ["SGLang 0.5.23 hashes pages with SHA-256; hash_algo must be 'sha256' for SGLang."]


def test_namespace_unique_per_model(served_model, tenant):
    make_release(served_model, "production-2026-07")
    assert refused(_release(served_model))["namespace"] == [
        "Served model 'qwen3-8b' already has a release with namespace 'production-2026-07'."
    ]
    # Another model (another vLLM name) may reuse the tag: its keys differ by model name.
    make_release(make_model(tenant, "llama", model_path="meta/Llama-3"), "production-2026-07")


@pytest.mark.parametrize("state", ["draining", "retired"])
def test_new_release_state_refused(served_model, state):
    assert refused(_release(served_model, state=state))["state"] == [
        f"A new release must start as 'warming' or 'serving', not '{state}'."
    ]


@pytest.mark.parametrize(
    ("path", "target", "allowed"),
    [
        (["serving"], "warming", "'draining'"),
        (["serving", "draining", "retired"], "serving", "none (final state)"),
        (["serving", "draining", "retired"], "warming", "none (final state)"),
        (["serving"], "retired", "'draining'"),
    ],
)
def test_state_transition_refused(served_model, path, target, allowed):
    release = make_release(served_model)
    for state in path:
        release.state = state
        release.full_clean()
        release.save()
    current = path[-1]
    release.state = target
    assert refused(release)["state"] == [f"A release cannot move from '{current}' to '{target}'; allowed: {allowed}."]


def test_serving_stamps_first_served_at(served_model):
    release = make_release(served_model)
    assert release.first_served_at is None and not release.has_served
    release.state = "serving"
    release.full_clean()
    release.save()
    stamp = release.first_served_at
    assert stamp is not None
    for state in ("draining", "serving"):
        release.state = state
        release.full_clean()
        release.save()
    assert release.first_served_at == stamp


# --- request group -----------------------------------------------------------------------------------------


def test_cache_salt_generated_when_omitted(tenant):
    group = make_group(tenant)
    assert re.fullmatch(r"[0-9a-f]{32}", group.cache_salt)
    assert make_group(tenant, "app-b").cache_salt != group.cache_salt


def test_empty_salt_is_the_single_default_shared_group(tenant):
    make_group(tenant, "shared", cache_salt="")
    assert refused(RequestGroup(tenant=tenant, name="shared-2", cache_salt=""))["cache_salt"] == [
        "Tenant 'acme' already has the default shared group (empty cache_salt); there is only one default shared "
        "cache per tenant."
    ]
    make_group(make_tenant("other"), "shared", cache_salt="")


def test_cache_salt_unique_across_tenants(tenant):
    make_group(tenant, "a", cache_salt="application-a")
    errors = refused(RequestGroup(tenant=make_tenant("other"), name="b", cache_salt="application-a"))
    assert errors["cache_salt"] == ["This cache_salt is not available; omit cache_salt to get a fresh one."]
    errors = refused(RequestGroup(tenant=tenant, name="b", cache_salt="application-a"))
    assert errors["cache_salt"] == ["Request group 'a' of this tenant already uses this cache_salt; salts must be unique."]


def test_cache_salt_is_stable(tenant):
    group = make_group(tenant, cache_salt="application-a")
    group.cache_salt = "application-b"
    assert refused(group)["cache_salt"] == [
        "cache_salt is stable once the group exists: changing it would split the group's cached prefixes. "
        "Create a new request group instead."
    ]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("name", "App A", "'App A' must be 1-63 lower-case letters, digits or inner '-' (e.g. 'node-a')."),
        ("cache_salt", "has space", "This value must not contain whitespace."),
    ],
)
def test_request_group_fields_refused(tenant, field, value, message):
    assert refused(RequestGroup(tenant=tenant, **{"name": "g", field: value}))[field] == [message]


def test_request_group_name_unique_per_tenant(tenant):
    make_group(tenant, "app-a")
    assert refused(RequestGroup(tenant=tenant, name="app-a"))["name"] == [
        "Tenant 'acme' already has a request group named 'app-a'."
    ]


# --- node and assignment -----------------------------------------------------------------------------------


def test_node_secret_generated(node):
    assert re.fullmatch(r"[0-9a-f]{64}", node.signing_secret)
    assert node.queue_name == "agent.node-a"
    old = node.signing_secret
    assert node.rotate_secret() != old
    node.refresh_from_db()
    assert node.signing_secret != old


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("name", "Node_A", "'Node_A' must be 1-63 lower-case letters, digits or inner '-' (e.g. 'node-a')."),
        ("hostname", "bad host", "'bad host' is not a host name or IP address."),
    ],
)
def test_node_fields_refused(field, value, message, db):
    assert refused(Node(**{"name": "n", "hostname": "h", field: value}))[field] == [message]


def test_node_name_unique_and_immutable(node):
    assert refused(Node(name="node-a", hostname="h"))["name"] == ["A node with this name already exists."]
    node.name = "node-z"
    assert refused(node)["name"] == [
        "A node's name cannot change (it is agent 'node-a''s identity and queue 'agent.node-a'). Create a new node instead."
    ]


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"tp_rank": 2, "tp_size": 2}, "tp_rank", "tp_rank must be below tp_size (2)."),
        ({"pp_rank": 1}, "pp_rank", "pp_rank must be below pp_size (1)."),
        ({"pcp_rank": 3, "pcp_size": 2}, "pcp_rank", "pcp_rank must be below pcp_size (2)."),
        ({"dcp_rank": 1}, "dcp_rank", "dcp_rank must be below dcp_size (1)."),
        ({"bootstrap_port": 8000}, "bootstrap_port", "bootstrap_port must differ from port."),
        ({"port": 70000}, "port", "Ensure this value is less than or equal to 65535."),
        ({"gpu_ids": "0,0"}, "gpu_ids", "gpu_ids '0,0' lists a device twice."),
        ({"gpu_ids": "gpu0"}, "gpu_ids", "gpu_ids 'gpu0' must be comma-separated device ordinals like '0,1'."),
        (
            {"engine": "sglang"},
            "engine",
            "engine 'sglang' differs from release 'production-2026-07''s engine 'vllm': instances of one release must "
            "run the same engine to share its cache.",
        ),
    ],
)
def test_assignment_refused(node, release, fields, field, message):
    assert refused(InstanceAssignment(node=node, release=release, **{"port": 8000, **fields}))[field] == [message]


def test_assignment_engine_defaults_to_release_engine(node, release):
    assert make_assignment(node, release).engine == "vllm"


def test_assignment_ports_unique_per_node(node, release):
    make_assignment(node, release, port=8000, role="prefill", bootstrap_port=8998)
    assert refused(InstanceAssignment(node=node, release=release, port=8000))["port"] == [
        "Port 8000 is not available on node 'node-a': another instance uses it. Choose another port."
    ]
    assert refused(InstanceAssignment(node=node, release=release, port=8001, bootstrap_port=8998))["bootstrap_port"] == [
        "Port 8998 is not available on node 'node-a': another instance uses it. Choose another port."
    ]
    make_assignment(make_node("node-b"), release, port=8000)


def test_retired_release_gets_no_new_instances(node, release):
    for state in ("serving", "draining", "retired"):
        release.state = state
        release.save()
    assert refused(InstanceAssignment(node=node, release=release, port=8000))["release"] == [
        "Release 'production-2026-07' is retired; it cannot get new instances."
    ]


def test_model_with_releases_cannot_move_tenant(release):
    model = release.model
    model.tenant = make_tenant("other")
    assert refused(model)["tenant"] == [
        "Served model 'qwen3-8b' has releases in tenant 'acme' (their budgets and cached keys belong to it); it cannot "
        "move to another tenant. Create the model in the other tenant instead."
    ]
