"""Transitional: now `python -m caramel.launch.one_tensorflow` (see `caramel.job`)."""

import sys

from caramel.launch.one_tensorflow import main

if __name__ == "__main__":
    sys.exit(main())
