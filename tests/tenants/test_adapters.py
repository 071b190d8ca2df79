"""LoRA adapters of a release: name + path rules, adapters stored before paths (migration 0005), fingerprint."""
from __future__ import annotations

import importlib

import pytest
from django.apps import apps as django_apps

from dashboard.forms import ReleaseForm
from tenants.fingerprint import canonical_settings, compute_fingerprint
from tenants.models import Release
from tenants.services import copy_release, validated_save
from tests.support.factories import (
    RELEASE_DEFAULTS,
    make_release,
    refused,
    refused_save,
)
from tests.tenants.test_fingerprint import SETTINGS

pytestmark = pytest.mark.django_db

SQL = {"name": "sql-lora", "path": "/adapters/sql-v1"}
CHAT = {"name": "chat-lora", "path": "org/chat-lora", "rank": 64}
HINT = "give an absolute directory such as '/adapters/sql-v1' or a hub id such as 'org/sql-lora'"
NAME_ONLY = (
    "adapter 'sql-lora' must be an object {\"name\": ..., \"path\": ...} (and optionally \"rank\"): the engines "
    "load a LoRA adapter from a path (an absolute directory or a hub id 'owner/name'), so a name alone cannot be "
    "launched."
)
NEEDS_PATH = (
    "adapter '{name}' needs a path: the absolute directory (e.g. '/adapters/sql-v1') or hub id ('org/sql-lora') the "
    "engines load it from. vLLM puts the path into every block hash of the adapter's requests, so it is part of the "
    "release's cache identity."
)


def _release(served_model, **kwargs) -> Release:
    return Release(model=served_model, namespace="prod-1", **{**RELEASE_DEFAULTS, **kwargs})


def _legacy(release: Release, *names: str) -> Release:
    """What migration 0005 leaves for a release that held names only (written past the model rules)."""
    Release.objects.filter(pk=release.pk).update(adapters=[{"name": name, "path": None} for name in names])
    release.refresh_from_db()
    return release


# --- rules ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("adapters", "message"),
    [
        (["sql-lora"], NAME_ONLY),
        ([7], 'each adapter must be an object {"name": ..., "path": ...} (and optionally "rank").'),
        ([{"path": "/a"}], "each adapter needs a non-empty 'name' (the LoRA name requests ask for)."),
        ([{"name": "a=b", "path": "/a"}], ("adapter name 'a=b' must not contain '=' (it separates the engines' "
                                          "name=path lists).")),
        ([{"name": "a,b", "path": "/a"}], ("adapter name 'a,b' must not contain ',' (it separates the engines' "
                                          "name=path lists).")),
        ([{"name": "a", "path": "/a", "base_model_name": "m"}],
         "adapter 'a' has unknown field(s) 'base_model_name'; allowed: name, path, rank."),
        ([{"name": "a", "path": ""}], f"adapter 'a' path must be a non-empty string: {HINT}."),
        ([{"name": "a", "path": "adapters"}],
         (f"adapter 'a' path 'adapters' is neither an absolute path nor a hub id 'owner/name' (at most 96 characters); "
         f"{HINT}.")),
        ([{"name": "a", "path": "org/team/lora"}],
         ("adapter 'a' path 'org/team/lora' is neither an absolute path nor a hub id 'owner/name' (at most 96 "
         f"characters); {HINT}.")),
        ([{"name": "a", "path": "org/x--y"}],
         ("adapter 'a' path 'org/x--y' is neither an absolute path nor a hub id 'owner/name' (at most 96 characters); "
         f"{HINT}.")),
        ([{"name": "a", "path": "./adapters/a"}],
         f"adapter 'a' path './adapters/a' is relative to the engine's home or working directory; {HINT}."),
        ([{"name": "a", "path": "~/a"}], (f"adapter 'a' path '~/a' is relative to the engine's home or working "
                                         f"directory; {HINT}.")),
        ([{"name": "a", "path": "/adapters//a"}],
         ("adapter 'a' path '/adapters//a' must be written as '/adapters/a': the path is part of every block hash of "
         "the adapter's requests, so one directory must have one spelling.")),
        ([{"name": "a", "path": "/adapters/a/"}],
         ("adapter 'a' path '/adapters/a/' must be written as '/adapters/a': the path is part of every block hash of "
         "the adapter's requests, so one directory must have one spelling.")),
        ([{"name": "a", "path": "/adapters/../a"}],
         ("adapter 'a' path '/adapters/../a' must be written as '/a': the path is part of every block hash of the "
         "adapter's requests, so one directory must have one spelling.")),
        ([{"name": "a", "path": "/"}], "adapter 'a' path '/' must name a directory below '/'."),
        ([{"name": "a", "path": "/a b"}], "adapter 'a' path must not contain whitespace."),
        ([{"name": "a", "path": "/a,b"}], ("adapter 'a' path '/a,b' must not contain ',' (it separates the engines' "
                                          "name=path lists).")),
        ([{"name": "a", "path": "/a", "rank": 0}],
         "adapter 'a' rank must be an integer from 1 to 512 (the LoRA rank r), not 0."),
        ([{"name": "a", "path": "/a", "rank": 513}],
         "adapter 'a' rank must be an integer from 1 to 512 (the LoRA rank r), not 513."),
        ([{"name": "a", "path": "/a", "rank": True}],
         "adapter 'a' rank must be an integer from 1 to 512 (the LoRA rank r), not True."),
        ([{"name": "a", "path": "/a", "rank": "16"}],
         "adapter 'a' rank must be an integer from 1 to 512 (the LoRA rank r), not '16'."),
        ([{"name": "a", "path": "/a"}, {"name": "a", "path": "org/a"}], "adapter 'a' is listed twice."),
    ],
)
def test_adapter_refused(served_model, adapters, message):
    assert refused(_release(served_model, adapters=adapters))["adapters"] == [message]


@pytest.mark.parametrize(
    "adapters",
    [
        [],
        [SQL, CHAT],
        [{"name": "a", "path": "/srv/it's/$HOME/a", "rank": None}],
        [{"name": "a", "path": "Org.Name/lora_v1.2-x"}],
        [{"name": "a", "path": "/a"}, {"name": "b", "path": "/a"}],  # two names for one directory
    ],
)
def test_adapter_accepted(served_model, adapters):
    assert validated_save(_release(served_model, adapters=adapters)).adapters == adapters


def test_new_adapter_needs_a_path(served_model):
    assert refused(_release(served_model, adapters=[{"name": "sql-lora", "path": None}]))["adapters"] == [
        NEEDS_PATH.format(name="sql-lora")]
    assert refused(_release(served_model, adapters=[{"name": "sql-lora"}]))["adapters"] == [
        NEEDS_PATH.format(name="sql-lora")]


# --- adapters stored without a path (before migration 0005) -------------------------------------------------------


def test_stored_adapter_without_path_stays_valid_while_unchanged(served_model):
    release = _legacy(make_release(served_model), "sql-lora")
    assert release.adapters_without_path == ["sql-lora"]
    release.state = "serving"
    release.description = "still serving its old adapter"
    validated_save(release)
    release.state = "draining"
    validated_save(release)
    assert Release.objects.get(pk=release.pk).adapters == [{"name": "sql-lora", "path": None}]


def test_no_new_adapter_without_path_next_to_a_stored_one(served_model):
    release = _legacy(make_release(served_model), "sql-lora")
    release.adapters = [*release.adapters, {"name": "chat-lora", "path": None}]
    assert refused(release)["adapters"] == [NEEDS_PATH.format(name="chat-lora")]


def test_warming_release_gets_the_path_of_a_stored_adapter(served_model):
    release = _legacy(make_release(served_model), "sql-lora")
    before = release.fingerprint
    release.adapters = [SQL]
    validated_save(release)
    assert release.adapters_without_path == [] and release.fingerprint != before


def test_served_release_keeps_its_pathless_adapter_and_a_copy_needs_the_path(served_model):
    release = _legacy(make_release(served_model, state="serving"), "sql-lora")
    release.adapters = [SQL]
    assert "adapters" in refused(release)  # the fingerprint of a served release is immutable
    original = Release.objects.get(pk=release.pk)
    assert refused_save(Release(**{**_copy_fields(original), "namespace": "prod-2"}))["adapters"] == [
        NEEDS_PATH.format(name="sql-lora")]
    copy = copy_release(original, "prod-2", adapters=[SQL])
    assert copy.adapters == [SQL] and copy.adapters_without_path == []


def _copy_fields(release: Release) -> dict:
    names = ("model", "weights_revision", "num_layers", "num_kv_heads", "head_dim", "block_size", "kv_dtype",
             "quantization", "adapters", "engine", "engine_version", "hash_algo", "hash_seed")
    return {name: getattr(release, name) for name in names}


def test_served_release_may_change_an_adapter_rank_but_not_its_path(served_model):
    release = make_release(served_model, state="serving", adapters=[SQL])
    fingerprint = release.fingerprint
    release.adapters = [{**SQL, "rank": 32}]
    validated_save(release)
    assert release.fingerprint == fingerprint
    release.adapters = [{**SQL, "path": "/adapters/sql-v2"}]
    assert "adapters" in refused(release)


# --- fingerprint ------------------------------------------------------------------------------------------------


def test_fingerprint_of_name_only_adapters_is_unchanged_by_the_migration():
    migrated = {**SETTINGS, "adapters": [{"name": "b", "path": None}, {"name": "a", "path": None}]}
    assert canonical_settings(migrated) == canonical_settings(SETTINGS)  # the pre-0005 encoding, byte for byte


@pytest.mark.parametrize(
    "change",
    [
        [{"name": "a", "path": "/adapters/a"}],
        [{"name": "a", "path": "/adapters/a-v2"}],
        [{"name": "b", "path": "/adapters/a"}],
        [{"name": "a", "path": "org/a"}],
        [],
    ],
)
def test_fingerprint_changes_with_an_adapter_name_or_path(change):
    base = {**SETTINGS, "adapters": [{"name": "a", "path": "/adapters/a"}]}
    changed = {**SETTINGS, "adapters": change}
    assert (compute_fingerprint(changed) == compute_fingerprint(base)) == (change == base["adapters"])


def test_fingerprint_ignores_adapter_order_and_rank():
    one = {**SETTINGS, "adapters": [SQL, CHAT]}
    other = {**SETTINGS, "adapters": [{**CHAT, "rank": 8}, {**SQL, "rank": 16}]}
    assert compute_fingerprint(one) == compute_fingerprint(other)


def test_release_fingerprint_follows_its_adapters(served_model):
    release = make_release(served_model, adapters=[SQL], hash_seed="7")
    before = release.fingerprint
    release.adapters = [{**SQL, "path": "/adapters/sql-v2"}]
    validated_save(release)
    twin = make_release(served_model, "prod-2", adapters=[{**SQL, "rank": 8}], hash_seed="7")
    assert release.fingerprint != before == twin.fingerprint


# --- migration 0005 ---------------------------------------------------------------------------------------------

MIGRATION = importlib.import_module("tenants.migrations.0005_adapter_paths")


def test_migration_keeps_names_as_adapters_without_path(served_model):
    release = make_release(served_model)
    other = make_release(served_model, "prod-2", adapters=[SQL])
    release.adapters = ["b", "a"]  # as stored before 0005, with the fingerprint computed then
    fingerprint = release.compute_fingerprint()
    Release.objects.filter(pk=release.pk).update(adapters=["b", "a"], fingerprint=fingerprint)
    stamp = Release.objects.get(pk=release.pk).updated_at
    MIGRATION.names_to_objects(django_apps, None)
    migrated = Release.objects.get(pk=release.pk)
    assert migrated.adapters == [{"name": "b", "path": None}, {"name": "a", "path": None}]
    assert migrated.updated_at == stamp and migrated.fingerprint == fingerprint
    assert migrated.compute_fingerprint() == fingerprint
    assert Release.objects.get(pk=other.pk).adapters == [SQL]
    MIGRATION.names_to_objects(django_apps, None)  # idempotent
    assert Release.objects.get(pk=release.pk).adapters == migrated.adapters


def test_migration_back_restores_names_and_refuses_to_drop_paths(served_model):
    release = _legacy(make_release(served_model), "b", "a")
    MIGRATION.objects_to_names(django_apps, None)
    assert Release.objects.get(pk=release.pk).adapters == ["b", "a"]
    make_release(served_model, "prod-2", adapters=[SQL])
    with pytest.raises(RuntimeError, match=r"prod-2 \(id \d+\)"):
        MIGRATION.objects_to_names(django_apps, None)
    assert Release.objects.get(pk=release.pk).adapters == ["b", "a"]


# --- the page form (dashboard.forms.AdaptersField) ---------------------------------------------------------------


def _form(served_model, adapters: str, instance: Release | None = None) -> ReleaseForm:
    data = {"model": served_model.pk, "namespace": "prod-1", "state": "warming", "kv_dtype": "auto",
            "hash_algo": "sha256", "hash_seed": "42", "adapters": adapters, **RELEASE_DEFAULTS}
    return ReleaseForm(data=data, instance=instance)


def test_form_reads_name_path_and_rank(served_model):
    form = _form(served_model, "sql-lora=/adapters/sql-v1, chat-lora=org/chat-lora;rank=64")
    assert form.is_valid(), form.errors
    assert form.cleaned_data["adapters"] == [SQL, CHAT]
    assert form.fields["adapters"].prepare_value([SQL, CHAT]) == (
        "sql-lora=/adapters/sql-v1, chat-lora=org/chat-lora;rank=64")


def test_form_refuses_a_name_without_path_with_the_model_message(served_model):
    form = _form(served_model, "sql-lora")
    assert not form.is_valid() and form.errors["adapters"] == [NEEDS_PATH.format(name="sql-lora")]
    form = _form(served_model, "sql-lora=/a;rank=x")
    assert not form.is_valid() and form.errors["adapters"] == [
        "adapter 'sql-lora' rank must be an integer from 1 to 512 (the LoRA rank r), not 'x'."]


def test_form_round_trips_a_stored_adapter_without_path(served_model):
    release = _legacy(make_release(served_model), "sql-lora")
    shown = ReleaseForm(instance=release)["adapters"].value()
    assert ReleaseForm.base_fields["adapters"].prepare_value(shown) == "sql-lora"
    form = _form(served_model, "sql-lora", instance=release)
    assert form.is_valid(), form.errors
    assert form.cleaned_data["adapters"] == [{"name": "sql-lora", "path": None}]


# --- REST API: same rules and messages, objects in and out --------------------------------------------------------

V1 = "/api/v1"


def _body(served_model, adapters) -> dict:
    return {"model": served_model.pk, "namespace": "prod-1", "adapters": adapters, **RELEASE_DEFAULTS}


def test_api_takes_and_returns_adapter_objects(api, served_model):
    response = api.post(f"{V1}/releases/", _body(served_model, [SQL, CHAT]), format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["adapters"] == [SQL, CHAT]
    config = api.get(f"{V1}/releases/{response.json()['id']}/config/").json()
    assert config["instances"] == []


@pytest.mark.parametrize(
    ("adapters", "message"),
    [
        (["sql-lora"], NAME_ONLY),
        ([{"name": "sql-lora"}], NEEDS_PATH.format(name="sql-lora")),
        ([{"name": "sql-lora", "path": "adapters/sql/"}],
         (f"adapter 'sql-lora' path 'adapters/sql/' is neither an absolute path nor a hub id 'owner/name' (at most "
         f"96 characters); {HINT}.")),
    ],
)
def test_api_400_names_adapters(api, served_model, adapters, message):
    response = api.post(f"{V1}/releases/", _body(served_model, adapters), format="json")
    assert response.status_code == 400 and response.json()["adapters"] == [message]
    assert not Release.objects.filter(namespace="prod-1").exists()


def test_api_copy_of_a_release_with_pathless_adapter_needs_the_path(api, served_model):
    release = _legacy(make_release(served_model), "sql-lora")
    response = api.post(f"{V1}/releases/{release.pk}/copy/", {"namespace": "prod-2"}, format="json")
    assert response.status_code == 400 and response.json()["adapters"] == [NEEDS_PATH.format(name="sql-lora")]
    response = api.post(f"{V1}/releases/{release.pk}/copy/", {"namespace": "prod-2", "adapters": [SQL]},
                        format="json")
    assert response.status_code == 201 and response.json()["adapters"] == [SQL]
    assert api.get(f"{V1}/releases/{release.pk}/").json()["adapters"] == [{"name": "sql-lora", "path": None}]
