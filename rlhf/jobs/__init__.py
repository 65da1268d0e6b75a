"""rlhf/jobs."""
