"""What the pages and the API show of the room under the master's eviction points and of implicit budgets (issue 18
item 4): the tenant page's room and advice (naming none of the other tenants to a tenant member), the overview's
watermark and room columns, the release page's and API's effective budget (read-only)."""
from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from dashboard.models import MasterHealth
from tests.support.factories import grant_role, make_model, make_release, make_tenant
from tests.support.rows import master_sample

pytestmark = pytest.mark.django_db
MiB = 1 << 20


@pytest.fixture
def pool(settings):
    """acme 50 MiB (release v1 budget 50 MiB, charged 30 MiB), globex 50 MiB (release g1 without a budget), 100 MiB
    mounted, watermark 0.9: shares of 45 MiB, so acme's budget passes its share and the pool's watermark."""
    settings.KVPOOL_MASTER_EVICTION_HIGH_WATERMARK_RATIO = 0.9
    acme, globex = make_tenant("acme", quota=50 * MiB), make_tenant("globex", quota=50 * MiB)
    v1 = make_release(make_model(acme, "chat", "/m"), "v1", budget_bytes=50 * MiB)
    g1 = make_release(make_model(globex, "chat", "/m"), "g1", state="serving")
    MasterHealth.objects.create(pk=1, up=True, checked_at=timezone.now(), capacity_bytes=100 * MiB, key_count=0)
    master_sample("acme", effective=50 * MiB, charged=30 * MiB)
    return acme, globex, v1, g1


def test_tenant_page_shows_the_room_and_what_to_lower_without_naming_other_tenants(client, pool, django_user_model):
    acme, globex, v1, g1 = pool
    member = grant_role(django_user_model.objects.create_user("ann", password="ann-pw"), acme, "viewer")
    client.force_login(member)
    page = client.get(reverse("ui:tenant", args=[acme.pk])).content.decode()
    room = page.split('id="tenant-room"')[1].split("</section>")[0]
    assert "watermark share" in room and f'data-bytes="{45 * MiB}"' in room
    assert f'<td id="quota-room"><span data-bytes="{20 * MiB}"' in room  # 50 MiB effective - 30 MiB charged
    assert f'<td id="watermark-room"><span data-bytes="{15 * MiB}"' in room  # 45 MiB share - 30 MiB charged
    assert "release &#x27;chat/v1&#x27; from 50 MiB to 45 MiB" in room and "globex" not in page
    assert client.get(reverse("ui:tenant", args=[globex.pk])).status_code == 404


def test_release_page_and_api_show_the_effective_budget_read_only(ui, api, pool):
    acme, globex, v1, g1 = pool
    page = ui.get(reverse("ui:release", args=[g1.pk])).content.decode()
    budget = page.split('id="release-budget"')[1].split("</p>")[0]
    assert f'data-bytes="{45 * MiB}"' in budget and "implicit" in budget
    own = ui.get(reverse("ui:release", args=[v1.pk])).content.decode().split('id="release-budget"')[1]
    assert f'data-bytes="{50 * MiB}"' in own.split("</p>")[0] and "implicit" not in own.split("</p>")[0]
    body = api.get(f"/api/v1/releases/{g1.pk}/").json()
    assert (body["budget_bytes"], body["effective_budget_bytes"], body["budget_is_implicit"]) == (None, 45 * MiB, True)
    listed = {row["namespace"]: row for row in api.get("/api/v1/releases/").json()["results"]}
    assert (listed["v1"]["effective_budget_bytes"], listed["v1"]["budget_is_implicit"]) == (50 * MiB, False)
    response = api.patch(f"/api/v1/releases/{g1.pk}/", {"effective_budget_bytes": 1, "budget_is_implicit": False},
                         format="json")
    assert response.status_code == 200 and response.json()["effective_budget_bytes"] == 45 * MiB  # read-only
    response = api.patch(f"/api/v1/releases/{v1.pk}/", {"budget_bytes": 40 * MiB}, format="json")
    assert response.status_code == 200 and response.json()["effective_budget_bytes"] == 40 * MiB
    assert api.get(f"/api/v1/releases/{g1.pk}/").json()["effective_budget_bytes"] == 45 * MiB  # its share, still


def test_overview_shows_the_watermark_and_each_tenants_room(ui, pool):
    page = ui.get(reverse("ui:overview")).content.decode()
    card = page.split('id="eviction-watermark"')[1].split("</section>")[0]
    assert "90 MiB" in card and "budgets let the master evict" in card
    table = page.split('id="tenant-quotas"')[1].split("</table>")[0]
    acme_row = next(row for row in table.split("<tr>") if ">acme<" in row)
    assert f'<td class="num quota-room"><span data-bytes="{20 * MiB}"' in acme_row
    assert "budgets above watermark share" in acme_row
    warnings = page.split('id="warnings"')[1]
    assert "the budgets of tenant &#x27;acme&#x27; can hold 50 MiB, 5 MiB (5242880 bytes) above its share" in warnings
