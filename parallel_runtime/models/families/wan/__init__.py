"""Wan 2.1 / 2.2 video (WanTransformer3DModel): T2V 1.3B / 14B, I2V 14B, Wan 2.2 A14B experts and TI2V-5B."""

ID = "wan"
# shipped configs (configs/<variant>/); T2V 14B is also each expert of Wan 2.2 T2V A14B
T2V_1_3B, T2V_14B, I2V_14B = "wan2.1-t2v-1.3b", "wan2.1-t2v-14b", "wan2.1-i2v-14b"
I2V_A14B, TI2V_5B = "wan2.2-i2v-a14b", "wan2.2-ti2v-5b"
