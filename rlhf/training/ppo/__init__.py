"""rlhf/training/ppo."""
