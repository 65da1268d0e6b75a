"""`python -m cli` from a checkout: the same command line as the installed `rlhf-studio`."""
import sys

from cli import main

sys.exit(main())
