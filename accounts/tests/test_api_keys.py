from __future__ import annotations

from django.test import override_settings
from django.utils import timezone

from accounts import keys
from accounts.models import ApiKey
from core import tenancy


def test_issued_keys_have_the_documented_format(cast):
    raw = cast.alice_key.raw
    assert raw.startswith("recall_live_")
    assert len(raw) == len("recall_live_") + 32
    assert keys.is_well_formed(raw)
    assert cast.alice_key.raw != cast.bob_key.raw


def test_only_an_hmac_and_a_display_prefix_are_stored(cast):
    with tenancy.operator():
        stored = ApiKey.objects.get(id=cast.alice_key.key.id)
    assert cast.alice_key.raw not in (stored.key_hash, stored.prefix, stored.name)
    assert stored.prefix == cast.alice_key.raw[:20]
    assert stored.key_hash == keys.digest(cast.alice_key.raw)


def test_a_key_finds_its_row(cast):
    found = ApiKey.objects.for_key(cast.bob_key.raw)
    assert found is not None
    assert found.id == cast.bob_key.key.id
    assert found.user_id == cast.alice.id


def test_it_rejects_unknown_and_malformed_keys(cast):
    forged = cast.alice_key.raw[:-1] + ("A" if cast.alice_key.raw[-1] != "A" else "B")
    assert ApiKey.objects.for_key(forged) is None
    assert ApiKey.objects.for_key("recall_live_short") is None
    assert ApiKey.objects.for_key("sk-" + "x" * 40) is None
    assert ApiKey.objects.for_key("") is None


def test_it_rejects_a_revoked_key(cast):
    with tenancy.operator():
        ApiKey.objects.filter(id=cast.alice_key.key.id).update(revoked_at=timezone.now())
    assert ApiKey.objects.for_key(cast.alice_key.raw) is None
    assert ApiKey.objects.for_key(cast.bob_key.raw) is not None


def test_it_rejects_the_key_of_a_deactivated_user(cast):
    cast.charlie.is_active = False
    cast.charlie.save()
    assert ApiKey.objects.for_key(cast.charlie_key.raw) is None


def test_keys_survive_a_secret_rotation_and_move_to_the_new_secret(cast, settings):
    old_secret = settings.API_KEY_SECRET
    with override_settings(
        API_KEY_SECRET="a-brand-new-secret", API_KEY_SECRET_FALLBACKS=[old_secret]
    ):
        found = ApiKey.objects.for_key(cast.alice_key.raw)
        assert found is not None
        with tenancy.operator():
            assert ApiKey.objects.get(id=found.id).key_hash == keys.digest(cast.alice_key.raw)
    with override_settings(API_KEY_SECRET="a-brand-new-secret", API_KEY_SECRET_FALLBACKS=[]):
        assert ApiKey.objects.for_key(cast.alice_key.raw) is not None
        # Bob's key was not used during the overlap, so it needs the fallback.
        assert ApiKey.objects.for_key(cast.bob_key.raw) is None


def test_a_tenant_sees_only_its_own_keys(cast):
    with tenancy.tenant(cast.alice.id):
        assert {k.id for k in ApiKey.objects.all()} == {cast.alice_key.key.id, cast.bob_key.key.id}
    with tenancy.tenant(cast.charlie.id):
        assert [k.id for k in ApiKey.objects.all()] == [cast.charlie_key.key.id]
