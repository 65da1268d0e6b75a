"""rlhf/training."""
