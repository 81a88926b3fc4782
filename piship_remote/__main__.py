"""``python -m piship_remote``: the command line."""

import sys

from piship_remote.cli import main

sys.exit(main())
