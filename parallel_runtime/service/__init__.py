"""The model service: host-side API (load, encode, sample, decode) and the worker-side model jobs."""
