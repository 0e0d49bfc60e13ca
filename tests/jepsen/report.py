"""The report folder of a Jepsen-style run: the verdict and the evidence next to the history.

``write_report`` adds three files to the folder the processes wrote their ``*.jsonl``
history into (the history stays where it is, the single source of every figure):

* ``anomalies.json``: every anomaly with the transactions it names, and those transactions'
  full events, so an anomaly can be followed without grepping the history;
* ``summary.md``: the verdict, the counts, and per fault kind how often it was injected,
  the anomalies around it (none expected) and the longest window without a commit;
* ``timeline.svg``: latency and commits per second over the run with every fault shaded.
  Drawn by hand: the plot must come out of any machine that runs the test, matplotlib or
  not, and a few hundred lines of SVG are easier to keep working than a dependency.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from xml.sax.saxutils import escape

from tests.jepsen.availability import (
    FaultFigure,
    by_kind,
    commit_gaps,
    commits_per_second,
    latencies,
    per_fault,
    span,
)
from tests.jepsen.checker import Anomaly, Report
from tests.jepsen.history import Event, Fault, Outcome, Txn

WIDTH, HEIGHT = 1200, 600
LEFT, RIGHT = 70, 20
TOP_PANEL = (50, 330)  # y range of the latency panel
BOTTOM_PANEL = (380, 540)  # y range of the commits-per-second panel
COLOURS = {
    Outcome.OK: "#2ca02c",
    Outcome.ABORTED: "#7f7f7f",
    Outcome.FAIL: "#ff7f0e",
    Outcome.INFO: "#d62728",
}
FAULT_COLOURS = ("#1f77b4", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
NO_FAULT = "(no fault)"
Scale = Callable[[float], float]


def write_report(
    folder: Path,
    events: list[Event],
    report: Report,
    *,
    seed: int,
    minutes: float,
    spec_text: str,
) -> Path:
    """Write the report files into ``folder``; the path of ``summary.md``."""
    folder.mkdir(parents=True, exist_ok=True)
    txns = {e.txn: e for e in events if isinstance(e, Txn)}
    figures = per_fault(events)
    (folder / "anomalies.json").write_text(
        json.dumps(_anomalies_doc(report, txns, seed, minutes), indent=1), encoding="utf-8"
    )
    (folder / "timeline.svg").write_text(timeline_svg(events, figures), encoding="utf-8")
    summary = folder / "summary.md"
    summary.write_text(
        summary_md(events, report, figures, seed=seed, minutes=minutes, spec_text=spec_text),
        encoding="utf-8",
    )
    return summary


def _anomalies_doc(
    report: Report, txns: dict[str, Txn], seed: int, minutes: float
) -> dict[str, object]:
    named = sorted({name for a in report.anomalies for name in a.txns})
    return {
        "ok": report.ok,
        "seed": seed,
        "minutes": minutes,
        "counts": report.by_kind(),
        "anomalies": [asdict(a) for a in report.anomalies],
        "transactions": {name: asdict(txns[name]) for name in named if name in txns},
    }


def attribute(
    anomalies: list[Anomaly], txns: dict[str, Txn], figures: list[FaultFigure]
) -> Counter[str]:
    """Anomalies per fault kind: those whose transactions overlap a fault of the kind, its
    window stretched to the first commit after the heal (a fault's effects outlive it).
    One anomaly may count for several kinds; one that overlaps none counts for
    ``NO_FAULT``."""
    windows = [(f.kind, f.start, f.end + (f.recovery or 0.0)) for f in figures]
    counts: Counter[str] = Counter()
    for anomaly in anomalies:
        spans = [(txns[n].start, txns[n].end) for n in anomaly.txns if n in txns]
        kinds = {
            kind for kind, start, end in windows if any(s <= end and e >= start for s, e in spans)
        }
        counts.update(kinds or {NO_FAULT})
    return counts


def summary_md(
    events: list[Event],
    report: Report,
    figures: list[FaultFigure],
    *,
    seed: int,
    minutes: float,
    spec_text: str,
) -> str:
    txns = {e.txn: e for e in events if isinstance(e, Txn)}
    verdict = "PASS: no anomaly" if report.ok else f"FAIL: {len(report.anomalies)} anomalies"
    outcomes = ", ".join(f"{o} {report.outcomes.get(str(o), 0)}" for o in Outcome)
    lines = [
        f"# Jepsen-style run: {verdict}",
        "",
        f"Seed {seed}, {minutes:g} minutes.",
        "",
        "## Counts",
        "",
        f"- transactions: {report.txns} ({outcomes})",
        f"- values written: {report.values_written}; distinct values read: {report.values_read}",
        f"- polls: {report.polls} returning {report.records_polled} records",
        f"- final read: {report.final_records} records",
        f"- faults injected: {report.faults}",
        "",
        "## Anomalies",
        "",
    ]
    if report.ok:
        lines.append("None.")
    else:
        lines += ["| kind | count |", "|---|---|"]
        lines += [f"| {kind} | {n} |" for kind, n in report.by_kind().items()]
        lines += ["", "First ones (all of them, with their transactions: anomalies.json):", ""]
        lines += [f"- **{a.kind}** {a.detail}" for a in report.anomalies[:30]]
    lines += ["", "## Per fault kind", ""]
    per_kind = attribute(report.anomalies, txns, figures)
    lines += [
        "| fault kind | injected | anomalies (0 expected) "
        "| longest window without a successful commit (s) | mean (s) "
        "| worst first commit after heal (s) |",
        "|---|---|---|---|---|---|",
    ]
    for figure in by_kind(figures):
        lines.append(
            f"| {figure.kind} | {figure.runs} | {per_kind.get(figure.kind, 0)} "
            f"| {figure.worst_gap:.2f} | {figure.mean_gap:.2f} | {figure.worst_recovery:.2f} |"
        )
    if per_kind.get(NO_FAULT):
        lines.append(f"| {NO_FAULT} | | {per_kind[NO_FAULT]} | | | |")
    gaps = commit_gaps(events)
    if gaps:
        worst = max(gaps, key=lambda g: g.length)
        lines += [
            "",
            f"Longest window without a successful commit over the whole run: "
            f"{worst.length:.2f} s (from {worst.start:.1f} s to {worst.end:.1f} s"
            f"{'' if worst.closed else ', the end of the run'}).",
        ]
    lines += [
        "",
        "## Files",
        "",
        "- `anomalies.json`: every anomaly and the full events of its transactions",
        "- `timeline.svg`: latency per transaction and commits per second, faults shaded",
        "- `history/*.jsonl`: the history, one file per process",
        "- `cluster/logs/`: the services' logs",
        "",
        "## Faults, in order",
        "",
        "| from (s) | to (s) | kind | what |",
        "|---|---|---|---|",
        *(
            f"| {f.start:.1f} | {f.end:.1f} | {f.kind} | {f.detail} |"
            for f in sorted((e for e in events if isinstance(e, Fault)), key=lambda f: f.start)
        ),
        "",
        "## Cluster",
        "",
        "```",
        spec_text.rstrip(),
        "```",
        "",
    ]
    return "\n".join(lines)


def nice_ticks(low: float, high: float, count: int = 8) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) covering [low, high]."""
    if high <= low:
        return [low]
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(low / step - 1e-9) * step
    ticks: list[float] = []
    value = first
    while value <= high + 1e-9 * step:
        ticks.append(round(value, 10))
        value += step
    return ticks


def _label(value: float) -> str:
    return f"{value:g}" if abs(value) < 1e5 else f"{value:.3g}"


def timeline_svg(events: list[Event], figures: list[FaultFigure]) -> str:
    """The run as a 1200x600 SVG: latency dots on top, commits per second below, every
    fault a translucent band (class ``fault``) across both, labelled with its kind."""
    origin, last = span(events)
    points = latencies(events)
    end = max([last, *(f.end for f in figures), *(p.end for p in points)]) - origin
    x_max = max(end, 1.0)
    x0, x1 = LEFT, WIDTH - RIGHT

    def x(t: float) -> float:
        return x0 + (t - origin) / x_max * (x1 - x0)

    top_max = max((p.latency for p in points), default=1.0) or 1.0
    rates = commits_per_second(events)
    rate_max = float(max((n for _, n in rates), default=1) or 1)
    lat_ticks = nice_ticks(0.0, top_max, 6)
    rate_ticks = nice_ticks(0.0, rate_max, 4)
    top_max, rate_max = max(top_max, lat_ticks[-1]), max(rate_max, rate_ticks[-1])

    def y_top(v: float) -> float:
        return TOP_PANEL[1] - v / top_max * (TOP_PANEL[1] - TOP_PANEL[0])

    def y_bottom(v: float) -> float:
        return BOTTOM_PANEL[1] - v / rate_max * (BOTTOM_PANEL[1] - BOTTOM_PANEL[0])

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
    ]
    out += _axes(x, origin, x_max, lat_ticks, y_top, rate_ticks, y_bottom)
    # one dot per pixel and outcome: 50,000 transactions must not make a 5 MB file
    drawn: set[tuple[int, int, Outcome]] = set()
    for outcome in (Outcome.OK, Outcome.ABORTED, Outcome.FAIL, Outcome.INFO):
        for p in points:
            if p.outcome is not outcome:
                continue
            cx, cy = round(x(p.end)), round(y_top(p.latency))
            if (cx, cy, outcome) in drawn:
                continue
            drawn.add((cx, cy, outcome))
            out.append(f'<circle cx="{cx}" cy="{cy}" r="1.6" fill="{COLOURS[outcome]}"/>')
    if rates:
        bar = max((x1 - x0) / x_max * 1.0 - 0.5, 0.5)
        for start, n in rates:
            if n:
                top, left = y_bottom(n), x(start)
                out.append(
                    f'<rect x="{left:.1f}" y="{top:.1f}" width="{min(bar, x1 - left):.1f}" '
                    f'height="{BOTTOM_PANEL[1] - top:.1f}" fill="#2ca02c"/>'
                )
    # the faults last, translucent over the data, so no bar or dot hides one
    kinds = sorted({f.kind for f in figures})
    for i, figure in enumerate(figures):
        colour = FAULT_COLOURS[kinds.index(figure.kind) % len(FAULT_COLOURS)]
        left = min(max(x(figure.start), x0), x1 - 1.0)
        right = min(max(x(figure.end), left + 1.0), x1)
        out.append(
            f'<rect class="fault" x="{left:.1f}" y="{TOP_PANEL[0]}" width="{right - left:.1f}" '
            f'height="{BOTTOM_PANEL[1] - TOP_PANEL[0]}" fill="{colour}" fill-opacity="0.15">'
            f"<title>{escape(figure.kind)} {escape(figure.detail)}</title></rect>"
        )
        out.append(
            f'<text x="{left + 2:.1f}" y="{TOP_PANEL[0] + 10 + (i % 3) * 11}" '
            f'fill="{colour}" font-size="9">{escape(figure.kind)}</text>'
        )
    for i, outcome in enumerate(COLOURS):
        lx = WIDTH - RIGHT - 300 + i * 75
        out.append(f'<circle cx="{lx}" cy="30" r="4" fill="{COLOURS[outcome]}"/>')
        out.append(f'<text x="{lx + 7}" y="34">{outcome}</text>')
    out.append('<text x="70" y="22" font-size="14">Transaction latency and commits</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _axes(
    x: Scale,
    origin: float,
    x_max: float,
    lat_ticks: list[float],
    y_top: Scale,
    rate_ticks: list[float],
    y_bottom: Scale,
) -> list[str]:
    """Frames, grid lines and tick labels of both panels."""
    x0, x1 = LEFT, WIDTH - RIGHT
    out: list[str] = []
    for (a, b), title in ((TOP_PANEL, "latency (s)"), (BOTTOM_PANEL, "commits / s")):
        out.append(
            f'<rect x="{x0}" y="{a}" width="{x1 - x0}" height="{b - a}" fill="none" stroke="#333"/>'
        )
        mid = (a + b) / 2
        out.append(
            f'<text x="16" y="{mid}" text-anchor="middle" '
            f'transform="rotate(-90 16 {mid})">{title}</text>'
        )
    for tick in nice_ticks(0.0, x_max, 12):
        tx = x(origin + tick)
        for _, b in (TOP_PANEL, BOTTOM_PANEL):
            out.append(f'<line x1="{tx:.1f}" y1="{b}" x2="{tx:.1f}" y2="{b + 4}" stroke="#333"/>')
        out.append(
            f'<text x="{tx:.1f}" y="{BOTTOM_PANEL[1] + 16}" text-anchor="middle">'
            f"{_label(tick)}</text>"
        )
    out.append(
        f'<text x="{(x0 + x1) / 2}" y="{HEIGHT - 8}" text-anchor="middle">'
        "seconds since start</text>"
    )
    for ticks, y in ((lat_ticks, y_top), (rate_ticks, y_bottom)):
        for tick in ticks:
            ty = y(tick)
            out.append(f'<line x1="{x0 - 4}" y1="{ty:.1f}" x2="{x1}" y2="{ty:.1f}" stroke="#ddd"/>')
            out.append(
                f'<text x="{x0 - 6}" y="{ty + 4:.1f}" text-anchor="end">{_label(tick)}</text>'
            )
    return out
