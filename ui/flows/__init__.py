"""ui/flows."""
