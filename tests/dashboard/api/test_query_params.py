"""Query parameters of the API lists: ids in ASCII digits only, date-times in range, strict limit/offset — each
bad value a 400 naming the parameter, never a 500 (SQLite overflows) or a silently different filter."""
from __future__ import annotations

import datetime as dt
from urllib.parse import unquote

import pytest

from tests.support.factories import (
    make_assignment,
    make_group,
    make_model,
    make_release,
    make_tenant,
)

pytestmark = pytest.mark.django_db

V1 = "/api/v1"
ID_FILTERS = [("releases", "tenant"), ("releases", "model"), ("models", "tenant"), ("request-groups", "tenant"),
              ("assignments", "node"), ("assignments", "release")]
# Query-string encoded: "+1" is " 1"; "%C2%B2" is "²", "%D9%A1" an Arabic-Indic one.
BAD_IDS = ["9223372036854775808", "99999999999999999999999", "1.5", "1e5", "1.0", "%C2%B2", "%D9%A1", "-1", "0",
           "%201", "0x1"]


def _decoded(value: str) -> str:
    return unquote(value)


@pytest.mark.parametrize(("resource", "parameter"), ID_FILTERS)
@pytest.mark.parametrize("value", BAD_IDS)
def test_id_filter_takes_only_ascii_digits(api, resource, parameter, value):
    response = api.get(f"{V1}/{resource}/?{parameter}={value}")
    assert response.status_code == 400, response.content
    assert response.json() == {parameter: [
        f"'{_decoded(value)}' is not an object id: use a positive integer in ASCII digits (at most "
        "9223372036854775807)."]}


def test_release_tenant_filter_is_exact_and_unknown_ids_are_400(api, node):
    acme, other = make_tenant("acme"), make_tenant("other")
    mine = make_release(make_model(acme))
    make_release(make_model(other, served_model_name="m2"), "prod-other")
    body = api.get(f"{V1}/releases/?tenant={acme.pk}").json()
    assert [item["id"] for item in body["results"]] == [mine.pk]
    missing = other.pk + 1000
    response = api.get(f"{V1}/releases/?tenant={missing}")
    assert response.status_code == 400 and list(response.json()) == ["tenant"]
    assert make_assignment(node, mine) and api.get(f"{V1}/assignments/?node={node.pk}").json()["count"] == 1
    assert api.get(f"{V1}/request-groups/?tenant={acme.pk}").json()["count"] == 0
    make_group(acme)
    assert api.get(f"{V1}/request-groups/?tenant={acme.pk}").json()["count"] == 1


def test_blank_id_filter_means_no_filter(api, release):
    assert api.get(f"{V1}/releases/?tenant=&model=").json()["count"] == 1


OUT_OF_RANGE = ["0001-01-01T00:00:00%2B05:00", "9999-12-31T23:59:59-05:00"]


@pytest.mark.parametrize("resource", ["audit", "telemetry/occupancy", "telemetry/master/samples"])
@pytest.mark.parametrize("parameter", ["since", "until"])
@pytest.mark.parametrize("value", OUT_OF_RANGE)
def test_out_of_range_datetime_is_400_naming_the_parameter(api, release, resource, parameter, value):
    response = api.get(f"{V1}/{resource}/?{parameter}={value}")
    assert response.status_code == 400, response.content
    assert response.json() == {parameter: [
        f"'{_decoded(value)}' is out of range: a date-time must lie between 0001-01-01T00:00:00Z and "
        "9999-12-31T23:59:59Z once converted to UTC."]}


@pytest.mark.parametrize("value", ["2000-01-01T00:00:00Z", "2000-01-01T05:00:00%2B05:00", "2000-01-01T00:00:00",
                                   "0001-01-01T00:00:00Z", "9999-12-31T23:59:59%2B00:00"])
def test_datetimes_in_range_filter(api, release, value):
    assert api.get(f"{V1}/audit/?since={value}").status_code == 200
    assert api.get(f"{V1}/audit/?until={value}").status_code == 200


def test_since_with_an_offset_is_the_same_instant_in_utc(api, release):
    from tenants.models import AuditEntry

    stamp = AuditEntry.objects.order_by("timestamp").last().timestamp
    count = AuditEntry.objects.filter(timestamp__gte=stamp).count()
    shifted = stamp.astimezone(dt.timezone(dt.timedelta(hours=5))).isoformat()
    utc = stamp.astimezone(dt.UTC).isoformat()
    assert api.get(f"{V1}/audit/", {"since": shifted}).json()["count"] == count
    assert api.get(f"{V1}/audit/", {"since": utc}).json()["count"] == count


# --- pagination -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("query", "parameter", "bound"), [
    ("limit=abc", "limit", "of at least 1"),
    ("limit=-1", "limit", "of at least 1"),
    ("limit=0", "limit", "of at least 1"),
    ("limit=1.5", "limit", "of at least 1"),
    ("limit=%C2%B2", "limit", "of at least 1"),
    ("offset=-5", "offset", "between 0 and 2147483647"),
    ("offset=abc", "offset", "between 0 and 2147483647"),
    ("offset=1e3", "offset", "between 0 and 2147483647"),
])
@pytest.mark.parametrize("resource", ["releases", "audit", "telemetry/occupancy", "telemetry/nodes"])
def test_invalid_limit_or_offset_is_400_naming_it(api, release, resource, query, parameter, bound):
    response = api.get(f"{V1}/{resource}/?{query}")
    assert response.status_code == 400, response.content
    raw = _decoded(query.split("=", 1)[1])
    assert response.json() == {parameter: [
        f"'{raw}' is not valid: {parameter} must be an integer {bound} (ASCII digits)."]}


def test_valid_and_blank_limit_and_offset(api, served_model):
    for name in ("prod-a", "prod-b", "prod-c"):
        make_release(served_model, name)
    page = api.get(f"{V1}/releases/?ordering=namespace&limit=1&offset=1").json()
    assert page["count"] == 3 and [item["namespace"] for item in page["results"]] == ["prod-b"]
    assert len(api.get(f"{V1}/releases/?limit=&offset=").json()["results"]) == 3
