"""rlhf/bench."""
