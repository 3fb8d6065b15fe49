"""The worker runtime: WorkerPool (launch, handshake, submit, events, cancel, monitor, shutdown), shared-memory rings, the worker main loop and jobs."""
