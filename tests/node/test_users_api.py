"""Accounts over HTTP: who may create whom, updates, the last admin, deactivation."""

from __future__ import annotations

from starlette.testclient import TestClient

from dpnode.node.db.models import User
from tests.conftest import PASSWORD, login
from tests.node.conftest import refused

USERS = "/api/v1/users"


def create(
    http: TestClient, headers: dict[str, str], email: str, role: str, password: str = PASSWORD
):  # type: ignore[no-untyped-def]
    return http.post(
        USERS, json={"email": email, "password": password, "role": role}, headers=headers
    )


def test_admin_creates_every_role_and_the_new_user_can_log_in(
    http: TestClient, admin_h: dict[str, str]
) -> None:
    for role in ("admin", "data_owner", "data_scientist"):
        response = create(http, admin_h, f"  New.{role}@Example.org", role)
        assert response.status_code == 201, response.text
        body = response.json()
        assert body["email"] == f"new.{role}@example.org"
        assert body["role"] == role
        assert body["is_active"] is True
        assert "password" not in str(body) and "hash" not in str(body)
        me = http.get(f"{USERS}/me", headers=login(http, f"new.{role}@example.org"))
        assert me.json()["id"] == body["id"]
        assert me.json()["role"] == role


def test_data_owner_creates_data_scientists_only(http: TestClient, owner_h: dict[str, str]) -> None:
    assert create(http, owner_h, "ds2@example.org", "data_scientist").status_code == 201
    for role in ("data_owner", "admin"):
        detail = refused(create(http, owner_h, f"x-{role}@example.org", role), 403, "forbidden")
        assert detail == f"a data_owner cannot create {role} accounts; ask an admin"


def test_data_scientist_creates_no_one(http: TestClient, ds_h: dict[str, str]) -> None:
    detail = refused(create(http, ds_h, "x@example.org", "data_scientist"), 403, "forbidden")
    assert detail == "a data_scientist cannot create data_scientist accounts; ask an admin"


def test_unknown_role_is_refused_with_the_choices(
    http: TestClient, admin_h: dict[str, str]
) -> None:
    detail = refused(create(http, admin_h, "x@example.org", "superuser"), 422, "invalid_request")
    assert detail == "unknown role 'superuser'; choose one of: admin, data_owner, data_scientist"


def test_bad_email_is_refused(http: TestClient, admin_h: dict[str, str]) -> None:
    for email in [
        "not-an-email",
        "a@b",
        "a b@example.org",
        "@example.org",
        "",
    ]:
        detail = refused(create(http, admin_h, email, "data_scientist"), 422, "invalid_request")
        assert detail == f"{email.strip().lower()!r} is not a valid email address"


def test_short_password_is_refused(http: TestClient, admin_h: dict[str, str]) -> None:
    response = create(http, admin_h, "x@example.org", "data_scientist", password="1234567")
    detail = refused(response, 422, "invalid_request")
    assert detail == "password too short: use at least 8 characters"


def test_duplicate_email_is_a_conflict_whatever_its_case(
    http: TestClient, admin_h: dict[str, str], scientist: User
) -> None:
    detail = refused(create(http, admin_h, "DS@Example.org", "data_owner"), 409, "conflict")
    assert detail == "a user with email ds@example.org already exists"
    # fullwidth letters are the same address; a zero-width space would be another that
    # looks the same: refused
    detail = refused(create(http, admin_h, "ＤＳ@example.org", "data_owner"), 409, "conflict")
    assert detail == "a user with email ds@example.org already exists"
    invisible = refused(
        create(http, admin_h, "d\u200bs@example.org", "data_owner"), 422, "invalid_request"
    )
    assert invisible.endswith("is not a valid email address")


def test_listing_users(
    http: TestClient, admin_h: dict[str, str], owner_h: dict[str, str], ds_h: dict[str, str]
) -> None:
    listed = http.get(USERS, headers=admin_h).json()
    assert [u["email"] for u in listed] == [
        "admin@example.org",
        "owner@example.org",
        "ds@example.org",
    ]
    assert http.get(USERS, headers=owner_h).status_code == 200
    assert (
        refused(http.get(USERS, headers=ds_h), 403, "forbidden")
        == "data scientists cannot list users"
    )


def test_admin_changes_role_and_password(
    http: TestClient, admin_h: dict[str, str], scientist: User
) -> None:
    response = http.patch(
        f"{USERS}/{scientist.id}",
        json={"role": "data_owner", "password": "a new password"},
        headers=admin_h,
    )
    assert response.status_code == 200, response.text
    assert response.json()["role"] == "data_owner"
    refused(
        http.post("/api/v1/auth/login", json={"email": scientist.email, "password": PASSWORD}),
        401,
        "unauthenticated",
    )
    headers = login(http, scientist.email, "a new password")
    assert http.get(f"{USERS}/me", headers=headers).json()["role"] == "data_owner"


def test_patch_refuses_bad_values_and_changes_nothing(
    http: TestClient, admin_h: dict[str, str], scientist: User
) -> None:
    url = f"{USERS}/{scientist.id}"
    detail = refused(
        http.patch(url, json={"role": "root"}, headers=admin_h), 422, "invalid_request"
    )
    assert detail.startswith("unknown role 'root'")
    detail = refused(
        http.patch(url, json={"role": "admin", "password": "short"}, headers=admin_h),
        422,
        "invalid_request",
    )
    assert detail == "password too short: use at least 8 characters"
    refused(http.patch(url, json={"is_admin": True}, headers=admin_h), 422, "invalid_request")
    assert (
        http.get(f"{USERS}/me", headers=login(http, scientist.email)).json()["role"]
        == "data_scientist"
    )
    assert (
        refused(http.patch(f"{USERS}/9999", json={}, headers=admin_h), 404, "not_found")
        == "no user with id 9999"
    )


def test_only_admins_patch_users(
    http: TestClient, owner_h: dict[str, str], ds_h: dict[str, str], scientist: User
) -> None:
    for headers in (owner_h, ds_h):
        response = http.patch(f"{USERS}/{scientist.id}", json={"role": "admin"}, headers=headers)
        assert refused(response, 403, "forbidden") == "only admins may do this"


def test_the_last_active_admin_cannot_be_removed(
    http: TestClient, admin: User, admin_h: dict[str, str]
) -> None:
    url = f"{USERS}/{admin.id}"
    message = "this change would leave the node without an active admin"
    assert (
        refused(http.patch(url, json={"is_active": False}, headers=admin_h), 409, "conflict")
        == message
    )
    assert (
        refused(http.patch(url, json={"role": "data_owner"}, headers=admin_h), 409, "conflict")
        == message
    )
    # Nothing changed: the admin still logs in and acts as admin.
    assert http.get(USERS, headers=login(http, admin.email)).status_code == 200

    second = create(http, admin_h, "admin2@example.org", "admin").json()
    response = http.patch(url, json={"role": "data_owner"}, headers=admin_h)
    assert response.status_code == 200, response.text
    # Now the second admin is the last one, and may not deactivate themself.
    headers2 = login(http, "admin2@example.org")
    response = http.patch(f"{USERS}/{second['id']}", json={"is_active": False}, headers=headers2)
    assert refused(response, 409, "conflict") == message


def test_deactivated_user_is_refused_at_login_and_with_an_existing_token(
    http: TestClient, admin_h: dict[str, str], scientist: User
) -> None:
    token = login(http, scientist.email)
    assert http.get(f"{USERS}/me", headers=token).status_code == 200
    response = http.patch(f"{USERS}/{scientist.id}", json={"is_active": False}, headers=admin_h)
    assert response.json()["is_active"] is False

    detail = refused(http.get(f"{USERS}/me", headers=token), 401, "unauthenticated")
    assert detail == "this account no longer exists or is deactivated"
    # Publishing reads the account in its worker thread: the same refusal, before any work.
    for path in ("/api/v1/publish?epsilon=0.1", "/api/v1/sensitivity"):
        response = http.post(path, content=b"not a graph", headers=token)
        assert refused(response, 401, "unauthenticated") == detail
    detail = refused(
        http.post("/api/v1/auth/login", json={"email": scientist.email, "password": PASSWORD}),
        401,
        "unauthenticated",
    )
    assert detail == "wrong email or password, or the account is deactivated"

    http.patch(f"{USERS}/{scientist.id}", json={"is_active": True}, headers=admin_h)
    assert http.get(f"{USERS}/me", headers=login(http, scientist.email)).status_code == 200


def test_is_active_is_a_json_boolean(
    http: TestClient, admin_h: dict[str, str], scientist: User
) -> None:
    # pydantic's lax bool read "off", "no", "0", "false" and 0 as false: an account deactivated
    url = f"{USERS}/{scientist.id}"
    for flag in ("off", "no", "0", "false", 0, "on", "yes"):
        response = http.patch(url, json={"is_active": flag}, headers=admin_h)
        assert refused(response, 422, "invalid_request") == (
            "invalid request: is_active: Input should be a valid boolean"
        ), flag
    assert http.get(f"{USERS}/me", headers=login(http, scientist.email)).status_code == 200
