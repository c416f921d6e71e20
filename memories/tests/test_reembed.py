from __future__ import annotations

import hashlib
from io import StringIO

import numpy as np
import pytest
from django.core.management import call_command

from accounts.tiers import Tier
from core import tenancy
from memories import embeddings, indexes, services
from memories.models import Memory


class HashEmbedder(embeddings.Embedder):
    """A stand-in second model: deterministic 16-dimensional vectors from word hashes."""

    model_id = "hash-16"
    dimensions = 16
    default_threshold = 0.0

    def embed(self, texts):
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().split():
                out[row, hashlib.sha256(word.encode()).digest()[0] % self.dimensions] += 1.0
        out += 1e-6
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    def embed_one(self, text):
        return self.embed([text])[0]

    def load(self):
        pass

    @property
    def is_loaded(self):
        return True


@pytest.fixture
def switch_model(monkeypatch):
    """Return a function that makes the configured model a different one from then on.

    Index DDL commits, so afterwards the real model's index is put back.
    """
    fake = HashEmbedder()
    real = embeddings.get_embedder()
    yield lambda: monkeypatch.setattr(embeddings, "get_embedder", lambda: fake)
    indexes.drop_vector_index(fake.model_id)
    indexes.ensure_vector_index(real.model_id, real.dimensions)


# Index DDL cannot run in the test's wrapping transaction after inserts there.
pytestmark = pytest.mark.django_db(transaction=True)


def test_it_re_embeds_every_memory_with_the_configured_model(cast, switch_model):
    for c in ["alpha beta", "gamma delta", "epsilon zeta"]:
        services.remember(user_id=cast.alice.id, tier=Tier.PRO, content=c)
    services.remember(user_id=cast.charlie.id, tier=Tier.PRO, content="charlie's memory")
    switch_model()

    # Before re-embedding, the new model finds nothing: no mixing of models.
    assert services.recall(user_id=cast.alice.id, query="alpha beta", threshold=0) == []

    out, err = StringIO(), StringIO()
    call_command("reembed", "--batch-size", "2", "--drop-old-indexes", stdout=out, stderr=err)

    assert "Re-embedded 4 memories with hash-16" in out.getvalue()
    assert "4/4" in err.getvalue()  # the progress bar reached the end
    with tenancy.operator():
        assert set(Memory.objects.values_list("embedding_model", flat=True)) == {"hash-16"}
        assert {len(v) for v in Memory.objects.values_list("embedding", flat=True)} == {16}
        assert "hash-16" in indexes.existing_models()
        assert "all-MiniLM-L6-v2" not in indexes.existing_models()
    found = services.recall(user_id=cast.alice.id, query="alpha beta", threshold=0)
    assert found[0]["content"] == "alpha beta"
    assert len(found) == 3


def test_a_dry_run_changes_nothing(cast, switch_model):
    services.remember(user_id=cast.alice.id, tier=Tier.PRO, content="stay as you are")
    switch_model()

    out = StringIO()
    call_command("reembed", "--dry-run", stdout=out)

    assert "1 memories to re-embed with hash-16; nothing changed." in out.getvalue()
    with tenancy.operator():
        assert list(Memory.objects.values_list("embedding_model", flat=True)) == [
            "all-MiniLM-L6-v2"
        ]


def test_re_embedding_and_an_edit_of_a_memory_in_its_batch_both_finish(cast, switch_model):
    # A batch updated its memories one statement each: the first update took
    # the namespace's generation, and the next memory's row was then asked
    # for while an edit held it and waited for the generation. The batch's
    # rows are now locked first, in id order, as every writer of several.
    from memories.tests.test_write_races import HIGH, LOW, crossing, ids_in_turn

    with ids_in_turn(LOW, HIGH):
        for content in ["alpha beta", "gamma delta"]:
            services.remember(user_id=cast.alice.id, tier=Tier.PRO, content=content)
    switch_model()

    done = crossing(
        cast.alice.id,
        lambda: services.reembed(batch_size=64),
        HIGH,
        "UPDATE memories SET priority = 'high' WHERE id = %s",
        HIGH,
    )

    assert (done.done, done.skipped) == (2, 0)
    with tenancy.operator():
        assert set(Memory.objects.values_list("embedding_model", flat=True)) == {"hash-16"}
        assert Memory.objects.get(id=HIGH).priority == "high"
