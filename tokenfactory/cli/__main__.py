"""``python -m tokenfactory.cli``: the command line (what the ``tokenfactory`` script runs)."""

import sys

from tokenfactory.cli import main

if __name__ == "__main__":  # imported (a module walk), it runs nothing
    sys.exit(main())
