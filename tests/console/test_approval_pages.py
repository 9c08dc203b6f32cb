"""The approvals page and the API behind it, without a browser (on each backend): what a
waiting publish computes, its description as text, and who may read it."""

from __future__ import annotations

from starlette.testclient import TestClient

from dpnode.core.engine import GraphBuilder, encode
from dpnode.node.db.models import User
from tests.conftest import login
from tests.console.conftest import Browser, Pending
from tests.node.conftest import publish

SCRIPT = '<script>alert("x")</script> & a <b>bold</b> plan'


def test_a_description_with_markup_is_shown_as_text(
    http: TestClient, pending: Pending, admin_browser: Browser
) -> None:
    b = GraphBuilder()
    x = b.input(f"dataset:{pending.dataset_id}/x", "float64", (50,))
    frame = encode(b.build([b.op("mean", x, dims=[0])]))
    waiting = publish(http, pending.ds_h, frame, 0.9, description=SCRIPT)
    assert waiting.json()["error"] == "approval_required", waiting.text
    html = admin_browser.get("/console/approvals").text
    assert SCRIPT not in html and "<script>alert" not in html
    escaped = "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; a &lt;b&gt;bold&lt;/b&gt; plan"
    assert escaped in html
    assert "x0 = visits[&#34;x&#34;]   # float64 (50,) bounds [0, 1]" in html
    assert "x1 = x0.mean(dims=[0])   # float64 ()" in html


def test_the_api_shows_a_scientist_their_own_requests_and_an_admin_all(
    http: TestClient, pending: Pending, admin: User, owner: User
) -> None:
    # the owner (not an admin) asks too, on a dataset they own: they see its cap
    owner_h = login(http, owner.email)
    waiting = publish(http, owner_h, pending.frame, 0.7, description="owner's check")
    assert waiting.json()["error"] == "approval_required", waiting.text
    everyone = http.get("/api/v1/publish/approvals", headers=login(http, admin.email)).json()
    assert len(everyone) == 2
    assert all(a["datasets"][0]["budget"] is not None for a in everyone)
    (mine,) = http.get("/api/v1/publish/approvals", headers=pending.ds_h).json()
    assert mine["id"] == pending.approval_id and mine["description"] == ""
    assert mine["computation"][0].startswith('x0 = visits["x"]')
    read = {"dataset_id": pending.dataset_id, "name": "visits", "budget": None}
    assert mine["datasets"] == [read]
    (owners,) = http.get("/api/v1/publish/approvals", headers=owner_h).json()
    assert owners["description"] == "owner's check"
    assert owners["datasets"][0]["budget"]["capped"] is False
    refused = http.get(f"/api/v1/datasets/{pending.dataset_id}/budget", headers=pending.ds_h)
    assert refused.status_code == 403 and refused.json()["error"] == "forbidden"
    assert "owner of dataset 'visits'" in refused.json()["detail"]
    too_long = publish(http, pending.ds_h, pending.frame, 0.9, description="y" * 501)
    assert too_long.status_code == 422, too_long.text


def test_a_requester_reads_what_their_own_waiting_publish_computes_as_text(
    http: TestClient, pending: Pending, ds_browser: Browser, admin: User, owner: User
) -> None:
    b = GraphBuilder()
    x = b.input(f"dataset:{pending.dataset_id}/x", "float64", (50,))
    frame = encode(b.build([b.op("mean", x, dims=[0])]))
    waiting = publish(http, pending.ds_h, frame, 0.9, description=SCRIPT)
    assert waiting.json()["error"] == "approval_required", waiting.text
    # someone else's waiting publish is not theirs to read
    other = publish(http, login(http, owner.email), frame, 0.7, description="owner's own check")
    assert other.json()["error"] == "approval_required", other.text
    html = ds_browser.get("/console/me").text
    assert SCRIPT not in html and "<script>alert" not in html
    escaped = "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; a &lt;b&gt;bold&lt;/b&gt; plan"
    assert f'You said: <q class="description">{escaped}</q>' in html
    new, first = waiting.json()["approval_id"], pending.approval_id
    for ident, last in ((new, "x1 = x0.mean(dims=[0])   # float64 ()"), (first, "x1 = x0.sum(")):
        start = html.index(f'id="waiting-{ident}"')
        card = html[start : html.index("</article>", start)]
        assert "x0 = visits[&#34;x&#34;]   # float64 (50,) bounds [0, 1]" in card
        assert last in card and "Sensitivity" in card and "Noise scale" in card
    assert (
        "owner&#39;s own check" not in html
        and f'id="waiting-{other.json()["approval_id"]}"' not in html
    )
    # answered, it is no longer waiting: its listing goes, its row stays in the table
    admin_h = login(http, admin.email)
    denied = http.post(
        f"/api/v1/publish/approvals/{new}/deny", json={"reason": "not now"}, headers=admin_h
    )
    assert denied.status_code == 200, denied.text
    html = ds_browser.get("/console/me").text
    assert f'id="waiting-{new}"' not in html and f'id="waiting-{first}"' in html
    assert "not now" in html
