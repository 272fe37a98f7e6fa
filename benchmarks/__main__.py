"""``python -m benchmarks <concern> <name> [args]`` (benchmarks/cli.py)."""

from benchmarks.cli import main

raise SystemExit(main())
