"""``python -m uniun.runtime`` is the same as ``uniun-runtime``."""

import sys

from uniun.runtime.cli import main

sys.exit(main())
