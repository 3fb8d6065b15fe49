"""HiDream-I1 (HiDreamImageTransformer2DModel): Full, Dev and Fast, a mixture-of-experts DiT (double- then
single-stream blocks) reading T5-XXL, two CLIPs (pooled) and one Llama-3.1 layer per block."""

ID = "hidream-i1"
HIDREAM_I1 = "hidream-i1-17b"  # the shipped config (configs/hidream-i1-17b/): Full, Dev and Fast share the architecture
