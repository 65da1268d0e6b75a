"""ui.plots: plot values round-trip through what handlers receive, styles follow the data, the restyle step is wired."""
import gradio as gr
import pandas as pd

from ui import plots


def test_payload_frame_reads_back_what_a_plot_sends():
    frame = pd.DataFrame({"step": [0, 1, 1], "value": [0.5, 0.25, 2.0], "metric": ["kl", "kl", "reward"]})
    payload = gr.LinePlot(x="step", y="value", color="metric").postprocess(frame).model_dump()
    back = plots.payload_frame(payload)
    assert back.to_dict(orient="records") == frame.to_dict(orient="records")
    assert plots.payload_frame(None).empty


def test_styles_follow_the_data():
    colors = plots.series_colors(["reward", "kl", "kl"])
    assert list(colors) == ["kl", "reward"] and colors["kl"] != colors["reward"]
    assert plots.series_colors(["kl", "reward", "loss"])["kl"] == colors["kl"]  # stable when a series is added
    frame = pd.DataFrame({"annotator": ["bob", "alice", "bob"], "metric": ["a", "b", "c"]})
    assert plots.by_category("annotator")(frame) == {"sort": ["bob", "alice"]}
    assert set(plots.by_color("metric")(frame)["color_map"]) == {"a", "b", "c"}


def test_keep_fresh_restyles_after_each_new_value():
    with gr.Blocks() as demo:
        plot = gr.LinePlot(x="step", y="value", color="metric")
        plots.keep_fresh(plot, plots.by_color("metric"))
    [dep] = [d for d in demo.config["dependencies"] if d["targets"] == [(plot._id, "change")]]
    restyle = demo.fns[dep["id"]].fn
    payload = plot.postprocess(pd.DataFrame({"step": [0], "value": [1.0], "metric": ["kl"]})).model_dump()
    update = restyle(payload)
    assert update["color_map"] == {"kl": plots.PALETTE[0]} and "value" not in update
    assert isinstance(restyle(None), type(gr.skip()))
