"""ui/state."""
