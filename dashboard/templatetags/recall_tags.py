from __future__ import annotations

import json
import re
import unicodedata
from datetime import datetime, timedelta
from typing import Any

from django import template
from django.conf import settings
from django.contrib.messages.storage.base import Message
from django.utils import timezone
from django.utils.html import conditional_escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timesince

from accounts import tiers

register = template.Library()


@register.simple_tag
def signup_enabled() -> bool:
    return settings.SIGNUP_ENABLED


@register.simple_tag
def free_tier_limit() -> int:
    return tiers.memory_limit(tiers.Tier.FREE) or 0


@register.filter
def percent(value: float | None) -> str:
    """Format a fraction as a percentage, with a decimal only where it matters."""
    if value is None:
        return "\u2013"  # an en dash: no value
    shown = value * 100
    return f"{shown:.1f}%" if 0 < shown < 10 else f"{shown:.0f}%"


@register.filter
def millis(value: float | None) -> str:
    if value is None:
        return "\u2013"  # an en dash: no value
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.0f} ms"


@register.filter
def when(value: str | None) -> str:
    """Show a service timestamp (ISO 8601, UTC) the way people read dates."""
    if not value:
        return ""
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return value
    return f"{moment:%b} {moment.day}, {moment:%Y %H:%M} UTC"


@register.filter
def last_used(value: datetime | None) -> str:
    """Say when a key was last used, in the words the Keys page shows.

    The time is written at most every 30 seconds per key (billing/usage.py),
    so under a minute it is "within the last minute", not "0 minutes ago".
    """
    if value is None:
        return "never"
    if timezone.now() - value < timedelta(minutes=1):
        return "within the last minute"
    return f"{timesince(value)} ago"


@register.filter
def as_json(value: Any) -> SafeString:
    """Show stored JSON (metadata) as JSON, not as Python's repr of it: escaped, with its
    bidirectional controls made visible (``shown``)."""
    return shown(json.dumps(value, ensure_ascii=False, sort_keys=True, default=str))


@register.filter
def restorable(message: Message) -> str:
    """Return the id of the memory a message offers to restore (its ``restore:<id>``
    tag, set by the Replaced button), or ""."""
    tag = str(message.extra_tags or "")
    return tag.removeprefix("restore:") if tag.startswith("restore:") else ""


# Bidirectional embeddings, overrides and isolates (U+202A-U+202E,
# U+2066-U+2069) reorder the text around them when shown: a stored memory
# that carries one can read as another ("Trojan Source"). They are shown as
# marks that name them instead. The direction marks (U+200E, U+200F,
# U+061C) are left as they are: Hebrew and Arabic text uses them, and each
# acts as one invisible letter of its direction, overriding nothing.
_BIDI_CONTROLS = re.compile("[\u202a-\u202e\u2066-\u2069]")


@register.filter(needs_autoescape=True)
def shown(value: Any, autoescape: bool = True) -> SafeString:
    """Stored text for a page: escaped, with each bidirectional control made visible."""
    text = str(conditional_escape(value) if autoescape else value)

    def mark(found: re.Match[str]) -> str:
        char = found.group()
        return f'<span class="control" title="{unicodedata.name(char)}">U+{ord(char):04X}</span>'

    return mark_safe(_BIDI_CONTROLS.sub(mark, text))  # noqa: S308 (escaped above)


@register.filter
def bare(value: Any) -> str:
    """Stored text for an attribute (an aria-label): its bidirectional controls left out."""
    return _BIDI_CONTROLS.sub("", str(value))


@register.filter
def clipped(value: Any, chars: int) -> str:
    """The first ``chars`` code points of ``value``, the last an ellipsis when it is longer.

    Counted as ``|length`` counts (Django's ``truncatechars`` leaves combining marks
    uncounted, so a text of accents came back whole).
    """
    text = str(value)
    return text if len(text) <= chars else text[: max(chars - 1, 0)] + "…"
