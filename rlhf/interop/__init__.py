"""rlhf/interop."""
