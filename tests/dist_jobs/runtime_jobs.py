"""Worker-side jobs for the runtime tests."""

from __future__ import annotations

import time


def ignore_cancel(ctx, seconds: float) -> float:
    """A job that never reaches a safe point (no check_cancel): only a restart can stop it."""
    time.sleep(seconds)
    return seconds
