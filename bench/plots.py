"""Draw the benchmark results as small PNGs.

    python bench/plots.py scale-10k-100k.json scale-1M.json --out bench/results

Several result files of ``bench/scale.py`` merge into one set of plots (later
files win for the same size and layout). matplotlib is a development extra,
imported only here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

LAYOUT_STYLE = {"one": "-", "spread": "--"}
DPI = 80


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def merge(reports: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Return results by layout, sorted by size."""
    chosen: dict[tuple[str, int], dict[str, Any]] = {}
    for report in reports:
        for result in report["results"]:
            chosen[(result["layout"], result["size"])] = result
    layouts: dict[str, list[dict[str, Any]]] = {}
    for (layout, _), result in sorted(chosen.items(), key=lambda item: item[0][1]):
        layouts.setdefault(layout, []).append(result)
    return layouts


PERCENTILE_COLOUR = {"p50": "tab:blue", "p95": "tab:orange", "p99": "tab:red"}


def _count(value: float, _: Any = None) -> str:
    for size, suffix in ((1_000_000, "M"), (1_000, "k")):
        if value >= size:
            return f"{value / size:g}{suffix}"
    return f"{value:g}"


def _axes(ax: Any, title: str, ylabel: str, *, logy: bool = True) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(_count))
    ax.xaxis.set_minor_formatter(NullFormatter())
    if logy:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("memories in the table", fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(True, which="both", alpha=0.3)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    _pyplot().close(fig)
    return path


def plot_scale(reports: list[dict[str, Any]], out: Path) -> list[Path]:
    plt = _pyplot()
    out.mkdir(parents=True, exist_ok=True)
    layouts = merge(reports)
    written = []

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    for ax, key, title in zip(
        axes,
        ("recall_raw_sql_ms", "recall_service_ms", "recall_service_embedded_ms"),
        ("recall: raw SQL", "recall service, query embedding excluded", "... included"),
        strict=True,
    ):
        for layout, results in layouts.items():
            sizes = [r["size"] for r in results]
            for pct, marker in (("p50", "o"), ("p95", "^"), ("p99", "s")):
                ax.plot(
                    sizes,
                    [r[key][pct] for r in results],
                    LAYOUT_STYLE.get(layout, ":"),
                    color=PERCENTILE_COLOUR[pct],
                    marker=marker,
                    markersize=4,
                    label=f"{layout} {pct}",
                )
        _axes(ax, title, "ms")
    axes[0].legend(fontsize=7)
    written.append(_save(fig, out / "scale_recall_latency.png"))

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    for layout, results in layouts.items():
        sizes = [r["size"] for r in results]
        style = LAYOUT_STYLE.get(layout, ":")
        ax = axes[0]
        ax.plot(
            sizes,
            [r["load"]["rows_per_s"] for r in results],
            style,
            marker="o",
            markersize=4,
            label=f"{layout}: bulk (COPY)",
        )
        ax.plot(
            sizes,
            [r["remember"]["stubbed_per_s"] for r in results],
            style,
            marker="^",
            markersize=4,
            label=f"{layout}: remember, embedding stubbed",
        )
        ax.plot(
            sizes,
            [r["remember"]["embedded_per_s"] for r in results],
            style,
            marker="s",
            markersize=4,
            label=f"{layout}: remember with the model",
        )
        axes[1].plot(
            sizes,
            [r["index"]["seconds"] for r in results],
            style,
            marker="o",
            markersize=4,
            label=layout,
        )
        axes[2].plot(
            sizes,
            [r["index"]["index_mib"] for r in results],
            style,
            marker="o",
            markersize=4,
            label=f"{layout}: HNSW index",
        )
        axes[2].plot(
            sizes,
            [r["index"]["table_mib"] for r in results],
            style,
            marker="^",
            markersize=4,
            label=f"{layout}: table",
        )
    _axes(axes[0], "ingest rate", "memories/s")
    _axes(axes[1], "HNSW index build", "seconds")
    _axes(axes[2], "size on disk", "MiB")
    axes[0].legend(fontsize=6)
    axes[2].legend(fontsize=6)
    written.append(_save(fig, out / "scale_ingest_index.png"))

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    for layout, results in layouts.items():
        sizes = [r["size"] for r in results]
        style = LAYOUT_STYLE.get(layout, ":")
        axes[0].plot(
            sizes,
            [r["recall_at_10"] for r in results],
            style,
            marker="o",
            markersize=4,
            label=f"{layout}: no filter",
        )
        for name, marker in (("1%", "^"), ("5%", "s")):
            axes[0].plot(
                sizes,
                [r["filters"][name]["recall_at_10"] for r in results],
                style,
                marker=marker,
                markersize=4,
                label=f"{layout}: {name} filter",
            )
            axes[1].plot(
                sizes,
                [r["filters"][name]["ms"]["p50"] for r in results],
                style,
                marker=marker,
                markersize=4,
                label=f"{layout}: {name} p50",
            )
        axes[2].plot(
            sizes,
            [r["list"]["offset_0_ms"]["p50"] for r in results],
            style,
            marker="o",
            markersize=4,
            label=f"{layout}: list p50",
        )
        axes[2].plot(
            sizes,
            [r["forget"]["by_id_ms"]["p50"] for r in results],
            style,
            marker="^",
            markersize=4,
            label=f"{layout}: forget by_id p50",
        )
        axes[2].plot(
            sizes,
            [r["remember"]["stubbed_ms"]["p50"] for r in results],
            style,
            marker="s",
            markersize=4,
            label=f"{layout}: remember p50",
        )
    _axes(axes[0], "HNSW recall@10 vs exact", "recall@10", logy=False)
    _axes(axes[1], "recall with a metadata filter", "ms")
    _axes(axes[2], "other operations (embedding excluded)", "ms")
    for ax in axes:
        ax.legend(fontsize=6)
    written.append(_save(fig, out / "scale_accuracy_filters.png"))

    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for layout, results in layouts.items():
        sizes = [r["size"] for r in results]
        style = LAYOUT_STYLE.get(layout, ":")
        server = [max(p["server_pss_mib"] for p in r["memory"].values()) for r in results]
        python = [max(p["python_rss_mib"] for p in r["memory"].values()) for r in results]
        ax.plot(sizes, server, style, marker="o", markersize=4, label=f"{layout}: PostgreSQL PSS")
        ax.plot(sizes, python, style, marker="^", markersize=4, label=f"{layout}: Python RSS")
    _axes(ax, "peak memory", "MiB")
    ax.legend(fontsize=6)
    written.append(_save(fig, out / "scale_memory.png"))

    sweeps = [
        (layout, r)
        for layout, results in layouts.items()
        for r in results
        if r.get("ef_search_sweep")
    ]
    if sweeps:
        fig, ax = plt.subplots(figsize=(5.5, 3.4))
        for layout, r in sweeps:
            points = r["ef_search_sweep"]
            xs = [p["raw_sql_ms"]["p50"] for p in points]
            ys = [p["recall_at_10"] for p in points]
            ax.plot(
                xs,
                ys,
                LAYOUT_STYLE.get(layout, ":"),
                marker="o",
                markersize=4,
                label=f"{r['size']:,} {layout}",
            )
            for p, x, y in zip(points, xs, ys, strict=True):
                ax.annotate(str(p["ef_search"]), (x, y), fontsize=6)
        ax.set_xscale("log")
        ax.set_title("ef_search: recall@10 against raw SQL p50", fontsize=9)
        ax.set_xlabel("raw SQL p50 (ms)", fontsize=8)
        ax.set_ylabel("recall@10", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
        written.append(_save(fig, out / "tuning_ef_search.png"))
    return written


def _ms(stats: dict[str, Any] | None, *keys: str) -> str:
    if not stats:
        return "—"
    return " / ".join(f"{stats[k]:.1f}" for k in keys)


def markdown_tables(reports: list[dict[str, Any]]) -> str:
    """Return BENCHMARKS.md's two scale tables, drawn from the result files."""
    rows = [r for layout in merge(reports).values() for r in layout]
    rows.sort(key=lambda r: (r["size"], r["layout"]))
    first = [
        "| size / layout | bulk load rows/s | index build s | index MiB | "
        "statement p50 / p95 / p99 ms | recall p50 / p95 / p99 ms | "
        "recall + query embedding p50 / p95 ms | HNSW recall@10 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    second = [
        "| size / layout | filter 1% p50 / p95 ms | filter 5% p50 / p95 ms | "
        "list p50 ms (offset 0 / 1000) | remember p50 ms (stubbed / model) | "
        "forget by id / preview / confirm p50 ms | server PSS MiB (query / build) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        label = f"{_count(r['size'])} / {r['layout']}"
        first.append(
            f"| {label} | {r['load']['rows_per_s']:,.0f} | {r['index']['seconds']:.0f} | "
            f"{r['index']['index_mib']:,.0f} | "
            f"{_ms(r['recall_raw_sql_ms'], 'p50', 'p95', 'p99')} | "
            f"{_ms(r['recall_service_ms'], 'p50', 'p95', 'p99')} | "
            f"{_ms(r['recall_service_embedded_ms'], 'p50', 'p95')} | "
            f"{r['recall_at_10']:.3f} |"
        )
        filters = r.get("filters", {})
        memory = r.get("memory", {})
        second.append(
            f"| {label} | {_ms(filters.get('1%', {}).get('ms'), 'p50', 'p95')} | "
            f"{_ms(filters.get('5%', {}).get('ms'), 'p50', 'p95')} | "
            f"{_ms(r['list'].get('offset_0_ms'), 'p50')} / "
            f"{_ms(r['list'].get('offset_1000_ms'), 'p50')} | "
            f"{_ms(r['remember'].get('stubbed_ms'), 'p50')} / "
            f"{_ms(r['remember'].get('embedded_ms'), 'p50')} | "
            f"{_ms(r['forget'].get('by_id_ms'), 'p50')} / "
            f"{_ms(r['forget'].get('preview_ms'), 'p50')} / "
            f"{_ms(r['forget'].get('confirm_ms'), 'p50')} | "
            f"{memory.get('query', {}).get('server_pss_mib', 0):,.0f} / "
            f"{memory.get('index', {}).get('server_pss_mib', 0):,.0f} |"
        )
    return "\n".join(first) + "\n\n" + "\n".join(second) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Plot bench/scale.py result files.")
    parser.add_argument("files", type=Path, nargs="+", help="JSON written by --json.")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument(
        "--markdown", action="store_true", help="Print the BENCHMARKS.md tables instead."
    )
    args = parser.parse_args(argv)
    reports = [json.loads(path.read_text()) for path in args.files]
    if args.markdown:
        print(markdown_tables(reports), end="")
        return 0
    for path in plot_scale(reports, args.out):
        print(f"wrote {path} ({path.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
