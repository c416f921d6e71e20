"""Per-model HNSW indexes over ``memories.embedding``.

The column has no fixed width, so each embedding model gets a partial
expression index::

    CREATE INDEX ... ON memories USING hnsw ((embedding::vector(384)) vector_cosine_ops)
        WHERE embedding_model = 'all-MiniLM-L6-v2'

Searches cast the column the same way and filter on the same model, which is
what lets the planner use the index, and what keeps two models' vectors apart.
pgvector indexes ``vector`` up to 2,000 dimensions; wider models are indexed
as ``halfvec`` (up to 4,000), half precision being ample for ranking.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from typing import Any

import numpy as np
from django.conf import settings
from django.db import connection

_MODEL_ID = re.compile(r"[A-Za-z0-9._:/-]{1,100}")
MAX_VECTOR_DIMS = 2000
MAX_HALFVEC_DIMS = 4000


def vector_type(dimensions: int) -> str:
    """Return the SQL type searches and the index cast embeddings to."""
    if dimensions <= MAX_VECTOR_DIMS:
        return f"vector({int(dimensions)})"
    if dimensions <= MAX_HALFVEC_DIMS:
        return f"halfvec({int(dimensions)})"
    raise ValueError(f"pgvector cannot index {dimensions} dimensions with HNSW")


def vector_literal(vector: Any) -> str:
    """Return pgvector's text form of a vector, each component to float32 precision.

    Nine significant digits give back exactly the float32 that was stored,
    in about a third of the text and time of ``pgvector.Vector.to_text()``
    (which prints every component as a float64 repr): 170 against 450 µs for
    384 dimensions, on every recall and remember.

    A float32 array's text is kept for the last ``LITERALS`` vectors, by
    their bytes: a query answered from the query cache comes back as the
    same vector, and its text then costs a lookup instead of those 170 µs
    (BENCHMARKS.md, "Efficiency: the cached recall's path").
    """
    if isinstance(vector, np.ndarray) and vector.dtype == np.float32 and vector.ndim == 1:
        return _float32_literal(vector.tobytes())
    return _literal(vector)


# Recent vectors' text, ~6 KB each (key and text) at 384 dimensions.
LITERALS = 256


@functools.lru_cache(maxsize=LITERALS)
def _float32_literal(data: bytes) -> str:
    return _literal(np.frombuffer(data, dtype=np.float32))


def _literal(vector: Any) -> str:
    values = vector.tolist() if hasattr(vector, "tolist") else list(vector)
    if not all(math.isfinite(v) for v in values):
        raise ValueError("a vector component is not a finite number")
    return _literal_format(len(values)) % tuple(values)


@functools.lru_cache(maxsize=8)
def _literal_format(dimensions: int) -> str:
    return "[" + ",".join(["%.9g"] * dimensions) + "]"


def index_name(model_id: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "_", model_id.lower()).strip("_")[:30]
    digest = hashlib.sha256(model_id.encode()).hexdigest()[:8]
    return f"memories_hnsw_{slug}_{digest}"


def check_model_id(model_id: str) -> str:
    if not _MODEL_ID.fullmatch(model_id):
        raise ValueError(f"unusable embedding model id {model_id!r}")
    return model_id


def create_sql(model_id: str, dimensions: int) -> str:
    check_model_id(model_id)
    cast = vector_type(dimensions)
    opclass = "halfvec_cosine_ops" if cast.startswith("halfvec") else "vector_cosine_ops"
    return (
        f"CREATE INDEX IF NOT EXISTS {index_name(model_id)} ON memories "
        f"USING hnsw ((embedding::{cast}) {opclass}) "
        f"WITH (m = {settings.HNSW_M}, ef_construction = {settings.HNSW_EF_CONSTRUCTION}) "
        f"WHERE embedding_model = '{model_id}'"
    )


def ensure_vector_index(model_id: str, dimensions: int, using_connection=None) -> None:
    """Create the index for ``model_id`` unless it exists. Cheap when it does.

    The catalog is asked first, without a lock: ``CREATE INDEX IF NOT EXISTS``
    takes a share lock on ``memories`` before it looks, so every process that
    started (``stdio``, ``worker``) queued behind a write in progress, and
    every write after it queued behind that start.
    """
    conn = using_connection or connection
    with conn.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE i.indrelid = 'memories'::regclass AND c.relname = %s)",
            [index_name(model_id)],
        )
        (exists,) = cursor.fetchone()
        if not exists:
            cursor.execute(create_sql(model_id, dimensions))


def drop_vector_index(model_id: str, using_connection=None) -> None:
    conn = using_connection or connection
    with conn.cursor() as cursor:
        cursor.execute(f"DROP INDEX IF EXISTS {index_name(check_model_id(model_id))}")


def existing_models() -> list[str]:
    """Return the models that have an HNSW index, read back from the catalog."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = 'memories' "
            "AND indexname LIKE 'memories_hnsw_%%'"
        )
        found = []
        for (indexdef,) in cursor.fetchall():
            match = re.search(r"embedding_model\)::text = '([^']+)'", indexdef)
            if match:
                found.append(match.group(1))
        return found
