"""LTX-Video 0.9 (LTXVideoTransformer3DModel): text-to-video with cross-attention to T5 text."""

ID = "ltx-video"
LTXV_2B = "ltx-video-2b-v0.9"  # the shipped config (configs/<variant>/): 28 blocks, 32 heads x 64, T5-XXL text
CAUSAL_POSITIONS = "_causal_temporal_positioning"  # transformer config entry: a 0.9.5+ file's causal time positions
