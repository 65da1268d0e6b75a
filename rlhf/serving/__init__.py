"""rlhf/serving."""
