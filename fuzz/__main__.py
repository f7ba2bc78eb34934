"""``python3 -m fuzz``: see `fuzz.run`."""

from __future__ import annotations

import sys

from fuzz.run import main

sys.exit(main())
