"""The diffusion core: decoding conventions, attention masks, masking and losses, samplers, likelihood, model folders;
and what every layer above reads: Hugging Face hub cache access and the config error type."""
