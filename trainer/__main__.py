"""``python -m trainer`` is ``trainbus``."""

import sys

from ._cli import main

sys.exit(main())
