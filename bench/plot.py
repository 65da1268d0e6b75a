"""A dependency-free SVG chart for benchmark figures: the trade-off curve of `bench loop --sweep` (win rate against
distinct-2, one line per oracle, one point per value of the swept knob)."""
from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Sequence

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
W, H, PAD = 640, 440, 60


def _scale(values: Sequence[float], lo_px: float, hi_px: float, margin: float = 0.02):
    lo, hi = min(values) - margin, max(values) + margin
    span = (hi - lo) or 1.0
    return (lambda v: lo_px + (v - lo) / span * (hi_px - lo_px)), lo, hi


def _series(row: dict) -> str:
    """One line per oracle and knob (and seed, when rows carry several)."""
    knob = str(row.get("knob", "")).partition("=")[0]
    seed = f", seed {row['seed']}" if "seed" in row else ""
    return f"{row['oracle']}{seed}" + (f" · {knob}" if knob else "")


def _value(row: dict):
    """The swept value, as a number when it is one (points along a line follow it)."""
    text = str(row.get("knob", "")).partition("=")[2]
    try:
        return (0, float(text))
    except ValueError:
        return (1, text)


def tradeoff_svg(rows: Sequence[dict], path: Path, x: str = "distinct_2", y: str = "oracle_win_rate",
                 title: str = "Win rate vs distinct-2") -> Path:
    """Win rate (``y``) against distinct-2 (``x``) per oracle, points labelled with the swept value; the base's
    distinct-2 and the 0.05 band below it as a dashed line each."""
    xs = [r[x] for r in rows] + [r["base_distinct_2"] - 0.05 for r in rows if "base_distinct_2" in r]
    ys = [r[y] for r in rows] + [0.5]
    sx, x_lo, x_hi = _scale(xs, PAD, W - PAD)
    sy, y_lo, y_hi = _scale(ys, H - PAD, PAD)
    n_series = len({_series(r) for r in rows})
    height = H + 16 * n_series + 8  # the legend goes below the axis title
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" font-family="sans-serif" '
             f'font-size="12"><rect width="{W}" height="{height}" fill="white"/>',
             f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="black"/>',
             f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="black"/>',
             f'<text x="{W / 2}" y="{H - 14}" text-anchor="middle">distinct-2 of sampled replies (higher = more '
             'varied)</text>',
             f'<text x="16" y="{H / 2}" transform="rotate(-90 16 {H / 2})" text-anchor="middle">oracle win rate '
             'vs base</text>']
    for i in range(5):  # axis ticks
        xv, yv = x_lo + (x_hi - x_lo) * i / 4, y_lo + (y_hi - y_lo) * i / 4
        parts.append(f'<text x="{sx(xv):.1f}" y="{H - PAD + 16}" text-anchor="middle">{xv:.2f}</text>')
        parts.append(f'<text x="{PAD - 6}" y="{sy(yv) + 4:.1f}" text-anchor="end">{yv:.2f}</text>')
    parts.append(f'<line x1="{PAD}" y1="{sy(0.5):.1f}" x2="{W - PAD}" y2="{sy(0.5):.1f}" stroke="#bbb" '
                 'stroke-dasharray="2 3"/>')
    series = list(dict.fromkeys(_series(r) for r in rows))
    for k, name in enumerate(series):
        colour = COLOURS[k % len(COLOURS)]
        mine = sorted((r for r in rows if _series(r) == name), key=_value)
        base = sum(r["base_distinct_2"] for r in mine) / len(mine)
        for xv, dash in ((base, "6 3"), (base - 0.05, "1 3")):
            parts.append(f'<line x1="{sx(xv):.1f}" y1="{PAD}" x2="{sx(xv):.1f}" y2="{H - PAD}" stroke="{colour}" '
                         f'stroke-dasharray="{dash}" opacity="0.6"/>')
        points = " ".join(f"{sx(r[x]):.1f},{sy(r[y]):.1f}" for r in mine)
        parts.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        for r in mine:
            value = str(r.get("knob", "")).partition("=")[2]
            parts.append(f'<circle cx="{sx(r[x]):.1f}" cy="{sy(r[y]):.1f}" r="4" fill="{colour}"/>')
            parts.append(f'<text x="{sx(r[x]) + 6:.1f}" y="{sy(r[y]) - 6:.1f}" fill="{colour}">{escape(value)}</text>')
        parts.append(f'<text x="{PAD}" y="{H + 4 + 16 * k}" fill="{colour}">● {escape(name)}</text>')
    parts.append(f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>')
    parts.append(f'<text x="{W / 2}" y="36" text-anchor="middle" fill="#555">points: the knob\'s values · dashed: '
                 'the base · dotted: base − 0.05 (the voice goal)</text></svg>')
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts) + "\n")
    return path
