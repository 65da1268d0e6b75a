"""ui/api."""
