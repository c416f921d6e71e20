"""Staff requests to the admin, and only those, run on the operator path."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser
from django.db import IntegrityError, connection, transaction
from django.http import HttpResponse
from django.test import RequestFactory

from accounts.models import ApiKey, User
from core import tenancy
from memories.models import Memory
from recall.middleware import OperatorAdminMiddleware
from tests.support import store_memory


def seen_by(request) -> str | None:
    seen = {}

    def view(request):
        seen["path"] = tenancy.current()
        return HttpResponse()

    OperatorAdminMiddleware(view)(request)
    return seen["path"]


@pytest.fixture
def staff(db):
    return User.objects.create_user("ops@example.com", "pw", is_staff=True)


def request_as(user, path):
    request = RequestFactory().get(path)
    request.user = user
    return request


def test_a_staff_request_to_the_admin_runs_on_the_operator_path(staff):
    assert seen_by(request_as(staff, "/admin/accounts/apikey/")) == "operator"


@pytest.mark.parametrize("path", ["/usage/", "/api/keys", "/administer/"])
def test_a_staff_request_elsewhere_does_not(staff, path):
    assert seen_by(request_as(staff, path)) is None


def test_anonymous_and_non_staff_requests_to_the_admin_do_not(cast):
    assert seen_by(request_as(AnonymousUser(), "/admin/")) is None
    assert seen_by(request_as(cast.alice, "/admin/")) is None


def test_an_inactive_staff_user_does_not(staff):
    staff.is_active = False
    assert seen_by(request_as(staff, "/admin/")) is None


def test_the_admin_lists_every_tenants_keys(cast, admin_client):
    response = admin_client.get("/admin/accounts/apikey/")

    text = response.content.decode()
    for key in (cast.alice_key, cast.bob_key, cast.charlie_key):
        assert key.key.prefix in text


def test_a_failed_admin_request_keeps_none_of_its_writes(staff, cast):
    def view(request):
        ApiKey.objects.filter(id=cast.alice_key.key.id).update(name="half-done")
        return HttpResponse(status=500)

    OperatorAdminMiddleware(view)(request_as(staff, "/admin/"))

    with tenancy.operator():
        assert ApiKey.objects.get(id=cast.alice_key.key.id).name == "alice laptop"


def test_deleting_a_user_in_the_admin_deletes_their_hidden_rows(cast, admin_client):
    store_memory(cast.alice, "alice's first memory")
    store_memory(cast.charlie, "charlie's memory")

    response = admin_client.post(f"/admin/accounts/user/{cast.alice.id}/delete/", {"post": "yes"})

    assert response.status_code == 302
    assert not User.objects.filter(id=cast.alice.id).exists()
    with tenancy.operator():
        assert not Memory.objects.filter(user_id=cast.alice.id).exists()
        assert not ApiKey.objects.filter(user_id=cast.alice.id).exists()
        assert Memory.objects.filter(user_id=cast.charlie.id).count() == 1


def test_deleting_a_user_off_the_operator_path_fails_on_the_hidden_rows(cast):
    # Why the admin needs the operator path: Django collects related rows
    # itself, row-level security hides them, and the foreign key refuses.
    store_memory(cast.alice, "alice's memory")

    with pytest.raises(IntegrityError), transaction.atomic():
        User.objects.get(id=cast.alice.id).delete()
        # Django's foreign keys are checked at commit; check them now.
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
