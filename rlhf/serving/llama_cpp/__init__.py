"""The llama.cpp serving engine: GGUF base, GGUF LoRA per version, multi-sequence batches (see engine.py)."""
