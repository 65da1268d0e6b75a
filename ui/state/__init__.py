"""The stateful services ``ui.services.Services`` holds and both REST and Gradio share: the leaderboards refitted in
the background (leaderboard.py) and the per-person reply slots (slots.py). Plain classes: no Gradio, no FastAPI,
and nothing from ``ui.flows`` or ``ui.services`` (they import this package, never the reverse)."""
