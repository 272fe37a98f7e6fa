"""``python -m worker``: same as ``swiftserve-worker``."""

import sys

from worker.cli import main

sys.exit(main())
