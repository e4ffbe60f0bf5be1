"""``python -m bench.learning [--quick] [--sweep]``: the learning benchmark alone."""

import sys

from bench.learning.run import main

sys.exit(main())
