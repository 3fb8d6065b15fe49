"""Worker-side hooks and jobs for tests/test_protocol.py: a worker that reports other code at READY,
and one that sends the host malformed messages on request."""

from __future__ import annotations

import time

OTHER_CODE = "0123456789abcdef"  # what pretend_other_code's READY claims (no real hash is this)
MALFORMED = "send-a-malformed-message"  # an event kind send_malformed_on_request turns into one


def pretend_other_code(rank: int, world: int, which_rank: int) -> None:
    """worker_setup: ``which_rank``'s READY names other code than the host's (as a worker started
    from an edited package would, had it not refused its spec)."""
    if rank != which_rank:
        return
    from parallel_runtime.runtime import worker_loop
    from parallel_runtime.runtime.protocol import PROTOCOL_VERSION, Ready

    def ready_message(self, info):
        return Ready(self.rank, PROTOCOL_VERSION, OTHER_CODE, info)

    worker_loop.Worker.ready_message = ready_message


def send_malformed_on_request(rank: int, world: int) -> None:
    """worker_setup: an event of kind MALFORMED goes out as a malformed message instead: payload
    "tuple" -> the untyped protocol's ("result", job, rank, "ok", 1); "bad-error" -> a Result whose
    error is a string, not a RemoteError."""
    from parallel_runtime.runtime import worker_loop
    from parallel_runtime.runtime.protocol import Event, Result, to_wire

    send = worker_loop.Worker.send

    def send_or_break(self, msg):
        if not (isinstance(msg, Event) and msg.kind == MALFORMED):
            return send(self, msg)
        if msg.payload == "tuple":
            bad = ("result", msg.job_id, msg.rank, "ok", 1)
        else:
            bad = to_wire(Result(msg.job_id, msg.rank, "error", error="a string where a RemoteError belongs"))
        self.evt.put(bad, timeout=10.0, what="a malformed message", tag=(Result.TAG, msg.job_id))

    worker_loop.Worker.send = send_or_break


def emit_malformed_then_sleep(ctx, how: str, seconds: float) -> int:
    """Rank 0 asks for a malformed message; every rank then sleeps (the job stays pending)."""
    if ctx.rank == 0:
        ctx.emit(MALFORMED, how)
    time.sleep(seconds)
    return ctx.rank
