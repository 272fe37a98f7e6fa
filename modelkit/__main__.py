import sys

from modelkit.cli import main

sys.exit(main())
