"""``python -m fencing``: the command line, as ``fencing``."""

import sys

from ._cli import main

sys.exit(main())
