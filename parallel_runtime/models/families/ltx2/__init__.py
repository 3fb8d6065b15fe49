"""LTX-2 (LTX2VideoTransformer3DModel): Lightricks' audio-video model, run here video-only (audio refused)."""

ID = "ltx2"
LTX2_19B = "ltx-2-19b"  # the shipped config (configs/<variant>/): 48 blocks, 32 heads x 128, Gemma-3 12B text
