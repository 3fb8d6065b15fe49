"""Parallel layout: ParallelConfig, the device mesh, collectives named by intent, sharding, the
machine's devices and the automatic layout planner.
"""

from ..exports import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "config": ("MESH_DIMS", "ParallelConfig", "check_visible", "parse_devices", "validate_layout"),
        "mesh": ("CommStats", "ParallelMesh"),
        "stages": ("StagePlan", "plan_stages"),
        "collectives": (
            "agree_any",
            "all_gather_cat",
            "all_reduce_sum",
            "all_to_all",
            "exchange_halo",
            "gather_to",
            "recv_object",
            "recv_start",
            "ring_shift_start",
            "send_object",
            "send_start",
        ),
        "sharding": ("gather", "shard", "split_offsets", "split_sizes"),
        "machine": ("DeviceInfo", "GiB", "MachineInfo"),
        "layout": ("LayoutHints", "LayoutPlan", "LayoutRequest", "ModelInfo", "plan_layout"),
    },
)
