"""``python -m piship_remote.local``: serve the local E2B-compatible service."""

import sys

from piship_remote.local.service import main

sys.exit(main())
