"""``python -m bench``: run the benchmark suite (see ``bench.cli``)."""

import sys

from bench.cli import main

sys.exit(main())
