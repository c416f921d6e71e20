"""An import held to the free tier's quota embeds only what it can still store.

Reviewers (review140) uploaded 154 records with room for 98: all 152 valid
ones were embedded, 54 of them then dropped at the quota, and the report said
"152 embedded". The room left is looked up before each batch is embedded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.errors import QuotaExceeded
from memories import embeddings, services
from memories.importers import Source, run
from memories.importers.run import Options, run_import

pytestmark = pytest.mark.django_db(transaction=True)


def lines(path: Path, count: int) -> Path:
    records: list[dict[str, Any]] = [{"content": f"Imported fact {n}"} for n in range(count)]
    records += [{"content": ""}, {"text": None}]  # two refused
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


@pytest.mark.parametrize("batch", [256, 4], ids=["one batch", "batches of 4"])
def test_records_past_the_quota_are_neither_embedded_nor_counted_as_embedded(
    cast, tmp_path, settings, monkeypatch, batch
):
    settings.FREE_TIER_MAX_MEMORIES = 7
    monkeypatch.setattr(run, "BATCH", batch)
    services.remember(user_id=cast.alice.id, content="Already held one", tier="free")
    services.remember(user_id=cast.alice.id, content="Already held two", tier="free")
    embedder = embeddings.get_embedder()
    embedded: list[str] = []
    real = embedder.embed

    def counting(texts: list[str]) -> Any:
        embedded.extend(texts)
        return real(texts)

    monkeypatch.setattr(embedder, "embed", counting)
    saved: list[dict[str, Any]] = []

    with pytest.raises(QuotaExceeded):
        run_import(
            user_id=cast.alice.id,
            source=Source.at(lines(tmp_path / "many.jsonl", 15)),
            options=Options(format="jsonl"),
            tier="free",
            checkpoint=lambda report: saved.append(report.as_dict()),
        )

    report = saved[-1]
    assert (report["imported"], report["over_quota"]) == (5, report["read"] - 5 - report["refused"])
    assert report["embedded"] == 5
    assert len([text for text in embedded if text.startswith("Imported fact")]) == 5
