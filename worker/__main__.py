"""``python -m worker``: same as ``swiftserve-worker``."""

import sys

from worker.cli import main

if __name__ == "__main__":      # the engine process (spawn) must not run the worker again
    sys.exit(main())
