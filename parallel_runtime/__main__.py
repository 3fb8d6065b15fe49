"""``python -m parallel_runtime doctor | bench KIND | generate``: see :mod:`parallel_runtime.tools.cli`."""

from __future__ import annotations

import sys

from .tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
