"""The transformers engine: continuous batching over a Hugging Face causal LM (GPU, exact mode, CPU fallback)."""
