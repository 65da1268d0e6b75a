"""Small SVG charts a person reads at a glance: categories on a categorical axis, whole-number steps, one
quantity per axis, time in even bins.

Pure functions from plain numbers to an SVG string (shown with ``gr.HTML``), so the tests read what is drawn
and nothing depends on a plotting library's redraw rules. Text is escaped; colours follow ``PALETTE``;
axes and labels use ``currentColor`` so the charts read in light and dark themes alike.
"""
from __future__ import annotations

import html
import math
from typing import Optional, Sequence

PALETTE = ("#3b82f6", "#f97316", "#10b981", "#ef4444", "#8b5cf6", "#eab308", "#06b6d4", "#ec4899")
FONT = "font-family:ui-sans-serif,system-ui,sans-serif;font-size:11px"
MUTED = "opacity:0.55"
MIN_RATING_SPAN = 40.0  # rating points: the narrowest y axis of the rating chart


def nice_ticks(low: float, high: float, n: int = 5, integer: bool = False) -> list[float]:
    """About ``n`` round tick values covering [low, high] (whole numbers only when ``integer``)."""
    if high < low:
        low, high = high, low
    if high == low:
        high, low = high + 1, low - (0 if integer else 1)
    raw = (high - low) / max(n - 1, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    if integer:
        step = max(1, round(step))
    start = math.floor(low / step) * step
    ticks, value = [], start
    while value <= high + step * 1e-9:
        ticks.append(round(value, 10))
        value += step
    if ticks[-1] < high:
        ticks.append(round(value, 10))
    return ticks


def tick_text(value: float, step: Optional[float] = None) -> str:
    """A tick label: whole numbers without decimals, others with the decimals their axis's ``step`` needs (one
    format per axis, never an exponent: 999.8, 1000.0, 1000.2 rather than "1e+03" beside "1,000")."""
    if step is not None and step < 1:
        decimals = max(0, -math.floor(math.log10(step) + 1e-9))
        decimals += not math.isclose(round(step, decimals), step)
        return f"{value:,.{decimals}f}" if abs(value) >= 10000 else f"{value:.{decimals}f}"
    if float(value).is_integer():
        return f"{int(value):,}" if abs(value) >= 10000 else str(int(value))
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def _svg(width: int, height: int, body: list[str], label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{html.escape(label)}" '
            f'viewBox="0 0 {width} {height}" width="100%" style="max-width:{width}px;{FONT}">'
            + "".join(body) + "</svg>")


def _text(x: float, y: float, text: str, anchor: str = "middle", extra: str = "") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="currentColor" {extra}>'
            f"{html.escape(text)}</text>")


def _y_axis(ticks: list[float], y_of, left: float, right: float, title: str) -> list[str]:
    parts = []
    step = ticks[1] - ticks[0] if len(ticks) > 1 else None
    for t in ticks:
        y = y_of(t)
        parts.append(f'<line x1="{left}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}" stroke="currentColor" '
                     f'style="opacity:0.12"/>')
        parts.append(_text(left - 6, y + 4, tick_text(t, step), "end"))
    if title:
        parts.append(_text(12, (y_of(ticks[0]) + y_of(ticks[-1])) / 2, title, "middle",
                           f'transform="rotate(-90 12 {(y_of(ticks[0]) + y_of(ticks[-1])) / 2:.1f})"'))
    return parts


def empty_chart(message: str, width: int = 560, height: int = 80) -> str:
    """A frame that says why there is nothing to draw."""
    return _svg(width, height, [_text(width / 2, height / 2, message, "middle", f'style="{MUTED}"')], message)


# ---- ratings with intervals ---------------------------------------------------------------------------
def interval_chart(rows: Sequence[dict], y_title: str = "rating (Elo scale)", width: int = 560,
                   height: int = 300) -> str:
    """One column per category (a version): a dot at ``value``, a bar from ``low`` to ``high`` when there is an
    interval, and the value written beside it. Rows: label, value, low, high (None: no interval), note, color."""
    if not rows:
        return empty_chart("No versions yet.")
    values = [r["value"] for r in rows] + [v for r in rows for v in (r.get("low"), r.get("high")) if v is not None]
    # Ratings differ in whole points: versions rated about the same get an axis at least MIN_RATING_SPAN wide with
    # whole-number ticks, not a zoom into fractions of a point that makes a tie look like a spread.
    low, high = min(values), max(values)
    pad = max(0.0, (MIN_RATING_SPAN - (high - low)) / 2)
    ticks = nice_ticks(low - pad, high + pad, integer=True)
    left, right, top, bottom = 56, width - 12, 14, height - 46
    y_of = lambda v: bottom - (v - ticks[0]) / (ticks[-1] - ticks[0]) * (bottom - top)  # noqa: E731
    slot = (right - left) / len(rows)
    parts = _y_axis(ticks, y_of, left, right, y_title)
    for i, r in enumerate(rows):
        x = left + slot * (i + 0.5)
        color = r.get("color") or PALETTE[i % len(PALETTE)]
        title = html.escape(f"{r['label']}: {r['value']:.0f}" + (f" [{r['low']:.0f}, {r['high']:.0f}]"
                                                                  if r.get("low") is not None else "")
                            + (f" · {r['note']}" if r.get("note") else ""))
        parts.append(f"<g><title>{title}</title>")
        if r.get("low") is not None and r.get("high") is not None:
            y1, y2 = y_of(r["low"]), y_of(r["high"])
            parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y1:.1f}" y2="{y2:.1f}" stroke="{color}" '
                         'stroke-width="3"/>')
            for y in (y1, y2):
                parts.append(f'<line x1="{x - 7:.1f}" x2="{x + 7:.1f}" y1="{y:.1f}" y2="{y:.1f}" stroke="{color}" '
                             'stroke-width="2"/>')
            parts.append(f'<circle cx="{x:.1f}" cy="{y_of(r["value"]):.1f}" r="5" fill="{color}"/>')
        else:  # no interval yet: a hollow dot
            parts.append(f'<circle cx="{x:.1f}" cy="{y_of(r["value"]):.1f}" r="5" fill="none" stroke="{color}" '
                         'stroke-width="2"/>')
        parts.append(_text(x + 10, y_of(r["value"]) + 4, f"{r['value']:.0f}", "start"))
        parts.append("</g>")
        parts.append(_text(x, bottom + 16, r["label"], "middle", 'font-weight="600"'))
        if r.get("note"):
            parts.append(_text(x, bottom + 30, r["note"], "middle", f'style="{MUTED}"'))
    return _svg(width, height, parts, "ratings per version")


# ---- curves: one quantity per panel -------------------------------------------------------------------
def line_panel(name: str, points: Sequence[tuple[float, float]], color: str, x_title: str = "step",
               width: int = 360, height: int = 200) -> str:
    """One metric over whole-number steps: its own y axis, integer x ticks, a dot per logged value."""
    if not points:
        return empty_chart(f"{name}: nothing logged yet", width, 60)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x_ticks, y_ticks = nice_ticks(min(xs), max(xs), 6, integer=True), nice_ticks(min(ys), max(ys), 4)
    left, right, top, bottom = 52, width - 10, 22, height - 30
    x_span = (x_ticks[-1] - x_ticks[0]) or 1
    x_of = lambda v: left + (v - x_ticks[0]) / x_span * (right - left)  # noqa: E731
    y_of = lambda v: bottom - (v - y_ticks[0]) / (y_ticks[-1] - y_ticks[0]) * (bottom - top)  # noqa: E731
    parts = [_text(left, 13, name, "start", 'font-weight="600"')] + _y_axis(y_ticks, y_of, left, right, "")
    for t in x_ticks:
        parts.append(_text(x_of(t), bottom + 15, tick_text(t)))
    parts.append(_text((left + right) / 2, height - 2, x_title, "middle", f'style="{MUTED}"'))
    path = " ".join(f"{'M' if i == 0 else 'L'}{x_of(x):.1f},{y_of(y):.1f}" for i, (x, y) in enumerate(points))
    parts.append(f'<path d="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
    for x, y in points:
        parts.append(f'<circle cx="{x_of(x):.1f}" cy="{y_of(y):.1f}" r="2.5" fill="{color}">'
                     f"<title>{html.escape(f'{name} at {x_title} {tick_text(x)}: {y:.4g}')}</title></circle>")
    return _svg(width, height, parts, name)


def small_multiples(series: dict[str, Sequence[tuple[float, float]]], x_title: str = "step",
                    empty: str = "No training curves yet.") -> str:
    """One panel per metric, side by side (wrapping): each quantity on its own axis."""
    if not series:
        return empty_chart(empty)
    panels = [line_panel(name, points, PALETTE[i % len(PALETTE)], x_title)
              for i, (name, points) in enumerate(series.items())]
    return ('<div style="display:grid;grid-template-columns:repeat(auto-fill,minmax(300px,1fr));gap:8px">'
            + "".join(f"<div>{p}</div>" for p in panels) + "</div>")


# ---- counts over time ---------------------------------------------------------------------------------
def bar_chart(labels: Sequence[str], stacks: dict[str, Sequence[float]], y_title: str = "events",
              caption: Optional[str] = None, width: int = 560, height: int = 300, integer: bool = True,
              empty: str = "No feedback yet.", y_max: Optional[float] = None) -> str:
    """Stacked bars, one per bin or category (``labels``), one colour per kind (``stacks``), a legend (for more
    than one kind) and a caption. ``integer``: counts (whole-number ticks)."""
    if not labels:
        return empty_chart(empty)
    totals = [sum(s[i] for s in stacks.values()) for i in range(len(labels))]
    ticks = nice_ticks(0, y_max or max(max(totals), 1), 5, integer=integer)
    left, right, top, bottom = 52, width - 12, 24, height - 52
    y_of = lambda v: bottom - v / ticks[-1] * (bottom - top)  # noqa: E731
    slot = (right - left) / len(labels)
    parts = _y_axis(ticks, y_of, left, right, y_title)
    colors = {kind: PALETTE[i % len(PALETTE)] for i, kind in enumerate(stacks)}
    every = max(1, math.ceil(len(labels) / 8))  # at most ~8 time labels
    for i, label in enumerate(labels):
        x, base = left + slot * i, 0
        for kind, counts in stacks.items():
            n = counts[i]
            if n:
                parts.append(f'<rect x="{x + slot * 0.1:.1f}" y="{y_of(base + n):.1f}" width="{slot * 0.8:.1f}" '
                             f'height="{y_of(base) - y_of(base + n):.1f}" fill="{colors[kind]}">'
                             f"<title>{html.escape(f'{label}: {tick_text(n)} {kind}')}</title></rect>")
            base += n
        if i % every == 0:
            parts.append(_text(x + slot / 2, bottom + 15, label))
    for i, kind in enumerate(stacks if len(stacks) > 1 else []):
        x = left + i * 120
        parts.append(f'<rect x="{x}" y="4" width="10" height="10" fill="{colors[kind]}"/>')
        parts.append(_text(x + 14, 13, kind, "start"))
    if caption:
        parts.append(_text((left + right) / 2, height - 6, caption, "middle", f'style="{MUTED}"'))
    return _svg(width, height, parts, "feedback volume")
