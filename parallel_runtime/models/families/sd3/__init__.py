"""SD3 / SD3.5 (SD3Transformer2DModel): SD3 medium, SD3.5 medium (dual attention) and large."""

ID = "sd3"
SD3_MEDIUM, SD35_MEDIUM, SD35_LARGE = "sd3-medium", "sd3.5-medium", "sd3.5-large"  # shipped configs
