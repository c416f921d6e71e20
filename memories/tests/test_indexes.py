"""How vectors and indexes are spelled for PostgreSQL."""

from __future__ import annotations

import numpy as np
import pytest
from django.db import connection

from memories.indexes import vector_literal


def test_the_vector_literal_gives_back_the_exact_float32_components(db):
    vector = np.random.default_rng(3).normal(size=384).astype(np.float32)
    vector[:3] = [1e-38, -3.4028235e38, 0.0]

    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::vector::real[]", [vector_literal(vector)])
        stored = np.array(cursor.fetchone()[0], dtype=np.float32)

    assert np.array_equal(stored, vector)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_vector_that_is_not_finite_is_refused(bad):
    with pytest.raises(ValueError, match="finite"):
        vector_literal(np.array([0.5, bad], dtype=np.float32))


def test_a_vector_changed_in_place_gets_its_own_text_not_the_remembered_one():
    vector = np.random.default_rng(5).normal(size=384).astype(np.float32)
    first = vector_literal(vector)
    assert vector_literal(vector) == first  # the remembered text, the same

    vector[7] += 1.0  # the same array object, other bytes
    changed = vector_literal(vector)

    assert changed != first
    assert changed == vector_literal(vector.astype(np.float64))  # as if computed afresh
