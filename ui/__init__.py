"""The interface layer: one module per Gradio tab, the REST API, and the server that hosts both."""
