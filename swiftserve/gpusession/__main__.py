import sys

from swiftserve.gpusession.cli import main

sys.exit(main())
