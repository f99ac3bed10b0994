"""The config error type, here so that a library layer can name a bad config key without importing
the pipeline that loads the config (``ar2dlm.pipeline.config`` re-exports it)."""


class ConfigError(ValueError):
    def __init__(self, key: str, message: str):
        super().__init__(f"config key '{key}': {message}")
        self.key = key
