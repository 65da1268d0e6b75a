"""The load test runs only under `make load` (RLHF_LOAD=1): it takes minutes and loads every core."""
import os

collect_ignore_glob = [] if os.environ.get("RLHF_LOAD") == "1" else ["test_*.py"]
