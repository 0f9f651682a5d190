"""``python -m bench``: see bench/run.py for the options and exit codes."""
import sys

from bench.run import main

sys.exit(main())
