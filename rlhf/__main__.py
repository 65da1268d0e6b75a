"""`python -m rlhf` is the `rlhf-studio` command."""
import sys

from rlhf.cli import main

sys.exit(main())
