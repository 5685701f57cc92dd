"""``python -m trainer`` is ``trainbus``."""

import sys

from .cli._main import main

sys.exit(main())
