"""LoRA adapters and the dashboard's adapters field (``name=path;rank=N``, comma-separated): ``;`` is refused in
new adapter names and paths, adapters stored with one stay valid and survive page edits unchanged, and the field
reads back exactly what it shows."""
from __future__ import annotations

import random

import pytest
from django.core.exceptions import ValidationError

from dashboard.forms import AdaptersField, ReleaseForm
from tenants.models import Release
from tenants.services import copy_release, validated_save
from tenants.validators import LoraAdapter, validate_adapters, validate_new_adapter
from tests.support.factories import RELEASE_DEFAULTS, make_release, refused

pytestmark = pytest.mark.django_db

V1 = "/api/v1"
WHY = "it separates an adapter's path from its rank in the dashboard's adapters field, name=path;rank=N"
#: Stored before ';' was refused: a path that reads as "/adapters/x" with rank 5 in the old form.
TRICKY = {"name": "x", "path": "/adapters/x;rank=5", "rank": 7}


def _store(release: Release, adapters: list) -> Release:
    """Write ``adapters`` past the model rules (what a release saved before the ';' rule holds)."""
    Release.objects.filter(pk=release.pk).update(adapters=adapters)
    release.refresh_from_db()
    release.save()  # the fingerprint of the stored adapters, as it was computed then
    return Release.objects.get(pk=release.pk)


# --- the rule -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("adapter", "message"), [
    ({"name": "a;b", "path": "/adapters/a"}, f"adapter name 'a;b' must not contain ';' ({WHY})."),
    ({"name": "x", "path": "/adapters/x;rank=5"},
     f"adapter 'x' path '/adapters/x;rank=5' must not contain ';' ({WHY})."),
    ({"name": "x", "path": "/adapters/x;rank=5", "rank": 7},
     f"adapter 'x' path '/adapters/x;rank=5' must not contain ';' ({WHY})."),
    ({"name": "x", "path": "/a;b"}, f"adapter 'x' path '/a;b' must not contain ';' ({WHY})."),
])
def test_new_adapter_with_semicolon_is_refused_naming_name_or_path(served_model, adapter, message):
    release = Release(model=served_model, namespace="prod-1", adapters=[adapter], **RELEASE_DEFAULTS)
    assert refused(release) == {"adapters": [message]}


def test_api_refuses_semicolon_with_400_naming_adapters(api, served_model):
    body = {"model": served_model.pk, "namespace": "prod-1", "adapters": [TRICKY], **RELEASE_DEFAULTS}
    response = api.post(f"{V1}/releases/", body, format="json")
    assert response.status_code == 400
    assert response.json() == {"adapters": [f"adapter 'x' path '/adapters/x;rank=5' must not contain ';' ({WHY})."]}
    assert not Release.objects.filter(namespace="prod-1").exists()


# --- adapters stored with ';' stay loadable -------------------------------------------------------------------


def test_stored_adapter_with_semicolon_stays_valid_while_its_name_and_path_stay(served_model):
    release = _store(make_release(served_model), [TRICKY, {"name": "a;b", "path": "/adapters/a"}])
    fingerprint = release.fingerprint
    release.description = "edited"
    release.adapters = [{**TRICKY, "rank": 16}, {"name": "a;b", "path": "/adapters/a"}]  # rank is no identity
    validated_save(release)
    stored = Release.objects.get(pk=release.pk)
    assert stored.adapters[0] == {**TRICKY, "rank": 16} and stored.fingerprint == fingerprint
    stored.adapters = [{**TRICKY, "path": "/adapters/y;rank=5"}]
    assert refused(stored) == {"adapters": [f"adapter 'x' path '/adapters/y;rank=5' must not contain ';' ({WHY})."]}
    stored.adapters = [{**TRICKY, "name": "y"}]  # the same path under a new name is a new adapter
    assert "adapters" in refused(stored)


def test_api_patch_of_another_field_keeps_a_stored_semicolon_adapter(api, served_model):
    release = _store(make_release(served_model), [TRICKY])
    response = api.patch(f"{V1}/releases/{release.pk}/", {"description": "d"}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["adapters"] == [TRICKY] and response.json()["fingerprint"] == release.fingerprint


def test_copy_of_a_release_needs_semicolon_free_paths(served_model):
    original = _store(make_release(served_model), [TRICKY])
    with pytest.raises(ValidationError) as info:
        copy_release(original, "prod-2")
    assert info.value.message_dict == {
        "adapters": [f"adapter 'x' path '/adapters/x;rank=5' must not contain ';' ({WHY})."]}
    assert copy_release(original, "prod-2", adapters=[{"name": "x", "path": "/adapters/x-v2", "rank": 7}])


# --- the form reads back what it shows ------------------------------------------------------------------------

_SAFE = "abcXYZ019-_"
_SPECIAL = ".:/@#$'\"[]é;=,+%~ \t"


def _text(rng: random.Random, length: int) -> str:
    """Mostly letters and digits, about one character in six from ``_SPECIAL`` (separators, quotes, spaces)."""
    return "".join(rng.choice(_SPECIAL if rng.random() < 0.17 else _SAFE) for _ in range(length))


def _random_adapters(rng: random.Random) -> list[dict]:
    adapters = []
    for index in range(rng.randint(1, 4)):
        name = _text(rng, rng.randint(0, 6)) + str(index)  # distinct names
        kind = rng.random()
        if kind < 0.1:
            path = None
        elif kind < 0.3:
            path = f"{rng.choice(['org', 'Org.Name', 'a;b'])}/{rng.choice(['lora', 'x_y-1.2', 'b=c', 'r;rank=2'])}"
        else:
            path = "/" + "/".join(_text(rng, rng.randint(1, 6)) for _ in range(rng.randint(1, 3)))
            path += rng.choice(["", "", "", ";rank=5", ";rank=", "=1", ";"])
        adapter: dict = {"name": name, "path": path}
        rank = rng.random()
        if rank < 0.4:
            adapter["rank"] = rng.choice([1, 8, 64, 512, rng.randint(1, 512)])
        elif rank < 0.5:
            adapter["rank"] = None
        adapters.append(adapter)
    return adapters


def _accepted(adapters: list[dict]) -> bool:
    """True when the rules accept ``adapters`` as new adapters (``validate_adapters`` + ``validate_new_adapter``)."""
    try:
        validate_adapters(adapters)
        for adapter in adapters:
            validate_new_adapter(LoraAdapter(adapter["name"], adapter.get("path"), adapter.get("rank")))
    except ValidationError:
        return False
    return True


def _without_null_rank(adapters: list[dict]) -> list[dict]:
    return [{key: value for key, value in adapter.items() if not (key == "rank" and value is None)}
            for adapter in adapters]


def test_every_accepted_adapter_list_reads_back_as_shown():
    field, rng = AdaptersField(required=False), random.Random(20261130)
    checked: list[list[dict]] = []
    for _ in range(20000):
        adapters = _random_adapters(rng)
        if not _accepted(adapters):
            continue
        checked.append(adapters)
        shown = field.prepare_value(adapters)
        assert field.clean(shown) == _without_null_rank(adapters), shown  # '"rank": null' is no rank
    # The generator reaches many accepted lists: several adapters, ranks, paths with '=' and names with quotes.
    entries = [adapter for adapters in checked for adapter in adapters]
    assert len(checked) > 1000 and sum(len(adapters) > 1 for adapters in checked) > 200
    assert sum(adapter.get("rank") is not None for adapter in entries) > 200
    assert any("=" in (adapter["path"] or "") for adapter in entries)
    assert any(adapter["path"] is None for adapter in entries)
    assert any(set(adapter["name"]) & set("'\"$@#") for adapter in entries)


@pytest.mark.parametrize("adapters", [
    [TRICKY],
    [{"name": "x", "path": "/adapters/x;rank=5"}],
    [{"name": "x", "path": "/adapters/x;rank=5"}, {"name": "a;b", "path": None}],
    [{"name": "x", "path": "/a;b", "rank": None}, {"name": "y", "path": "/y", "rank": 8}],
])
def test_edit_form_keeps_stored_adapters_exactly_when_another_field_changes(served_model, adapters):
    release = _store(make_release(served_model), adapters)
    form = ReleaseForm(instance=release)
    data = {name: form[name].value() for name in form.fields}
    data = {name: "" if value is None else value for name, value in data.items()}
    data["adapters"] = form.fields["adapters"].prepare_value(data["adapters"])
    data["description"] = "edited on the page"
    bound = ReleaseForm(data=data, instance=release)
    assert bound.is_valid(), bound.errors
    assert "adapters" not in bound.changed_data and bound.cleaned_data["adapters"] == adapters
    assert bound.save_validated()
    stored = Release.objects.get(pk=release.pk)
    assert stored.adapters == adapters and stored.fingerprint == release.fingerprint
    assert stored.description == "edited on the page"


def test_edit_form_reads_a_changed_rank_of_a_stored_semicolon_path(served_model):
    release = _store(make_release(served_model), [TRICKY])
    form = ReleaseForm(instance=release)
    data = {name: "" if form[name].value() is None else form[name].value() for name in form.fields}
    data["adapters"] = "x=/adapters/x;rank=5;rank=16, new=/adapters/new"
    bound = ReleaseForm(data=data, instance=release)
    assert bound.is_valid(), bound.errors
    assert bound.cleaned_data["adapters"] == [{**TRICKY, "rank": 16}, {"name": "new", "path": "/adapters/new"}]


def test_edit_form_refuses_a_new_semicolon_path_with_the_model_message(served_model):
    release = make_release(served_model)
    form = ReleaseForm(instance=release)
    data = {name: "" if form[name].value() is None else form[name].value() for name in form.fields}
    data["adapters"] = "x=/adapters/x;v2"
    bound = ReleaseForm(data=data, instance=release)
    assert not bound.is_valid()
    assert bound.errors["adapters"] == [f"adapter 'x' path '/adapters/x;v2' must not contain ';' ({WHY})."]
