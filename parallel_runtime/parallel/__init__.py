"""Parallel layout: ParallelConfig, DeviceMesh, collectives named by intent, sharding, layout planner."""
