"""Worker process entry: ``python -m parallel_runtime.runtime.worker [labels...]``, its spec on stdin.

Reads the spec (JSON on stdin, not on the command line every user can read; protocol.py: a host of
other code is refused at once, before anything else), arms
the death pipe (lifeline.py) before anything slow is imported — torch takes seconds, and a host
dying in that window must not leave an orphan — then runs the worker loop (worker_loop.py): join
torch.distributed, say READY, run jobs until told to shut down or the host is gone.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import traceback

from ..errors import ProtocolError
from .lifeline import arm
from .protocol import WorkerSpec, refuse


def main(spec_json: str | None = None) -> int:
    """Run a worker from ``spec_json`` (read from stdin when None); the command line's labels are
    for people and tools only."""
    try:
        spec = WorkerSpec.from_json(sys.stdin.read() if spec_json is None else spec_json)
    except ProtocolError as exc:
        refuse(exc)  # exits
        raise
    arm(spec.death_fd, spec.shm_dir, spec.private_dir)
    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1, all_threads=True)

    def on_sigterm(*_):
        # Someone asked us to stop (the host kills with SIGKILL): leave cleanly, once.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sys.exit(143)

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # the host's end of our log pipe may be gone
    logging.basicConfig(
        level=spec.settings.log_level,
        stream=sys.stderr,
        format=f"[rank {spec.rank}] %(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from .worker_loop import Worker  # imports torch

    worker = Worker(spec)
    code = 0
    try:
        worker.setup()
        worker.run()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - print it, then leave like any other exit
        traceback.print_exc()
        code = 1
    finally:
        worker.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown (torch's and gloo's take seconds; see Worker.close)


if __name__ == "__main__":
    sys.exit(main())
