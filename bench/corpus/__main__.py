"""python -m bench.corpus NAME: run corpus job NAME as plain training (no tensortap code in it)."""

import sys

from bench.corpus import JOBS, run_plain

if len(sys.argv) != 2 or sys.argv[1] not in JOBS:
    sys.exit(f"usage: python -m bench.corpus NAME  (NAME one of: {', '.join(JOBS)})")
run_plain(sys.argv[1])
