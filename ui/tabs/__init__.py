"""ui/tabs: one module per Gradio tab, each with build_<tab>(services, ...)."""
