"""PipeFusion: transformer blocks split into pipeline stages, the latent into patches, stale K/V between steps."""
