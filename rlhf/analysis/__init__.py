"""rlhf/analysis."""
