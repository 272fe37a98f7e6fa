import sys

from swiftserve.cli import main

sys.exit(main())
