"""The ``<memory>`` tags agents receive recalled memories in.

Each result becomes one element whose attributes and text are HTML-escaped,
so stored text such as ``</memory>``, ``<memory id="fake">`` or ``<script>``
arrives as inert characters and can never close or forge a tag. Agents are
told (in the recall tool's description) to treat tag contents as data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from html import escape
from typing import Any


def memory_tag(result: Mapping[str, Any]) -> str:
    attributes = {"id": result["id"], "similarity": f"{float(result['similarity']):.4f}"}
    if result.get("score") is not None:
        attributes["score"] = f"{float(result['score']):.4f}"
    attributes["namespace"] = result.get("namespace", "")
    if result.get("created_at"):
        attributes["created_at"] = result["created_at"]
    # A replaced memory (returned only when asked for) says so in its tag.
    if result.get("superseded_by"):
        attributes["superseded_by"] = result["superseded_by"]
        attributes["superseded_at"] = result.get("superseded_at") or ""
    # A current memory a newer result likely restates names that result.
    if result.get("may_be_replaced_by"):
        attributes["may_be_replaced_by"] = result["may_be_replaced_by"]
    # An as_of result names the version whose content it shows.
    if result.get("version") is not None:
        attributes["version"] = str(result["version"])
    rendered = " ".join(
        f'{name}="{escape(str(value), quote=True)}"' for name, value in attributes.items()
    )
    return f"<memory {rendered}>{escape(result['content'], quote=True)}</memory>"


def memory_tags(results: Iterable[Mapping[str, Any]]) -> str:
    return "\n".join(memory_tag(result) for result in results)
