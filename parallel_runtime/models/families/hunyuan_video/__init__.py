"""HunyuanVideo 1.0 (HunyuanVideoTransformer3DModel): text-to-video and the two image-to-video models."""

ID = "hunyuan-video"
# shipped configs (configs/<variant>/): T2V 720p (guidance-distilled), I2V with the start image as 17 extra
# input channels ("latent_concat", 33 in), I2V with the start frame's tokens replaced ("token_replace", 16 in)
T2V, I2V_CONCAT, I2V_REPLACE = "hunyuan-video-t2v-720p", "hunyuan-video-i2v-33ch", "hunyuan-video-i2v-16ch"
