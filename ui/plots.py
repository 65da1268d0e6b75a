"""Native Gradio plots that redraw when the shape of what they show changes.

Gradio 6's LinePlot and BarPlot build their chart once and afterwards only swap the data in: a colour (or x
category) that was not in the first value is not drawn, and a value sent together with changed axis limits is
not drawn at all (seen in Chromium with gradio 6.31). So handlers send a plot its value alone, and
`keep_fresh` hangs a second step on the plot's own change event: it sends the props that follow from the data
(a colour per series, limits, the order of x categories). When those differ from the last ones, Gradio builds
the chart anew from the value it already holds.
"""
from __future__ import annotations

from typing import Callable, Iterable

import gradio as gr
import pandas as pd

from ui.views import PALETTE


def payload_frame(payload) -> pd.DataFrame:
    """A plot's value as its event handlers receive it (``{"columns", "data", ...}``) back as a DataFrame."""
    if not payload:
        return pd.DataFrame()
    return pd.DataFrame(payload["data"], columns=payload["columns"])


def series_colors(values: Iterable) -> dict[str, str]:
    """One palette colour per distinct value, in sorted order (stable across refreshes)."""
    return {v: PALETTE[i % len(PALETTE)] for i, v in enumerate(sorted({str(v) for v in values}))}


def by_color(column: str) -> Callable[[pd.DataFrame], dict]:
    """Style for a plot coloured by ``column``."""
    return lambda frame: {"color_map": series_colors(frame[column])}


def by_category(column: str) -> Callable[[pd.DataFrame], dict]:
    """Style for a plot whose x axis lists the categories in ``column`` (kept in the frame's order)."""
    return lambda frame: {"sort": list(dict.fromkeys(str(v) for v in frame[column]))}


def keep_fresh(plot, style: Callable[[pd.DataFrame], dict]) -> None:
    """After every new value of ``plot``, send ``style(value)`` so the chart is redrawn when it must be."""
    def restyle(payload):
        frame = payload_frame(payload)
        return gr.skip() if frame.empty else gr.update(**style(frame))

    plot.change(restyle, [plot], [plot], api_name=False, show_progress="hidden")
