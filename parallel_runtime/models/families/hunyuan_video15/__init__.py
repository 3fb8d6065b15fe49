"""HunyuanVideo 1.5 (HunyuanVideo15Transformer3DModel): text- and image-to-video from diffusers folders
(HunyuanVideo15Pipeline) and the transformer from single files (Tencent's and Comfy-Org's layouts, ``keys.py``).

ComfyUI 0.3.64 does not have it: diffusers' pipeline is the oracle, and the facts a later ComfyUI states for it
(model sampling, latent scale) are given where they are used.
"""

ID = "hunyuan-video-1.5"
T2V = "hunyuan-video-1.5-t2v"  # shipped config (configs/<variant>/): diffusers' HunyuanVideo15Transformer3DModel
