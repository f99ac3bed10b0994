"""The diffusion core: decoding conventions, attention masks, masking and losses, samplers, likelihood, model folders."""
