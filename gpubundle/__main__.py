import sys

from gpubundle.cli import main

sys.exit(main())
