"""The retrain: from feedback to a published, evaluated, gated version (its steps, one module each)."""
