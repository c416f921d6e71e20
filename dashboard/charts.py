"""Server-rendered SVG charts: no JavaScript, no build step, works offline.

``stacked_bars`` draws one bar per day, stacked by tool. Every segment
carries ``data-tool``, ``data-day`` and ``data-count`` attributes and a
``<title>`` (a native tooltip), so the numbers are readable by people, screen
readers and tests alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

# Distinguishable in both light and dark surroundings, and for the common
# forms of colour blindness (adapted from the Okabe-Ito set).
PALETTE = ("#4f6bed", "#e69f00", "#2a9d8f", "#cc79a7", "#d55e00", "#56b4e9", "#8c6d31")


@dataclass(frozen=True)
class LegendEntry:
    name: str
    color: str
    total: int


@dataclass(frozen=True)
class Chart:
    svg: SafeString
    legend: list[LegendEntry]
    total: int


def nice_ceiling(value: int) -> int:
    """Return the smallest of 1, 2, 5, 10, 20, 50, ... that is at least ``value``."""
    if value <= 1:
        return 1
    magnitude = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * magnitude >= value:
            return step * magnitude
    return 10 * magnitude  # unreachable: the loop ends at 10 * magnitude


def stacked_bars(
    days: list[date],
    series: dict[str, list[int]],
    *,
    width: int = 760,
    height: int = 240,
    label: str = "Calls per day",
) -> Chart:
    left, right, top, bottom = 40, 8, 12, 26
    plot_w, plot_h = width - left - right, height - top - bottom
    totals = [sum(values[i] for values in series.values()) for i in range(len(days))]
    peak = nice_ceiling(max(totals, default=0))
    colors = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(series)}
    slot = plot_w / max(len(days), 1)
    bar = max(2.0, slot * 0.7)

    def y(value: float) -> float:
        return top + plot_h - value / peak * plot_h

    parts: list[str] = []
    for tick in (0, peak / 2, peak) if peak > 1 else (0, peak):
        ty = y(tick)
        parts.append(
            f'<line class="grid" x1="{left}" x2="{width - right}" y1="{ty:.1f}" y2="{ty:.1f}"/>'
            f'<text class="axis" x="{left - 6}" y="{ty + 4:.1f}" text-anchor="end">'
            f"{tick:g}</text>"
        )
    every = max(1, math.ceil(len(days) / 8))
    for i, day in enumerate(days):
        x = left + i * slot + (slot - bar) / 2
        base = 0
        for name, values in series.items():
            count = values[i]
            if not count:
                continue
            seg_top, seg_bottom = y(base + count), y(base)
            tip = f"{day:%b %-d}: {count} {name} call{'s' if count != 1 else ''}"
            parts.append(
                f'<rect x="{x:.1f}" y="{seg_top:.1f}" width="{bar:.1f}" '
                f'height="{max(seg_bottom - seg_top, 0.5):.1f}" fill="{colors[name]}" '
                f'data-tool="{escape(name)}" data-day="{day.isoformat()}" data-count="{count}">'
                f"<title>{escape(tip)}</title></rect>"
            )
            base += count
        # Counted back from the last day, so today always has its label and
        # no label crowds it.
        if (len(days) - 1 - i) % every == 0:
            parts.append(
                f'<text class="axis" x="{x + bar / 2:.1f}" y="{height - 8}" '
                f'text-anchor="middle">{day:%b %-d}</text>'
            )
    total = sum(totals)
    summary = f"{label}: {total} call{'s' if total != 1 else ''} over {len(days)} days"
    svg = (
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(summary)}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{escape(summary)}</title>{''.join(parts)}</svg>"
    )
    legend = [LegendEntry(name, colors[name], sum(values)) for name, values in series.items()]
    return Chart(svg=mark_safe(svg), legend=legend, total=total)  # noqa: S308 - every value escaped
