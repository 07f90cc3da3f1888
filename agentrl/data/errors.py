"""The one error type of every dataset reader, so CLIs report any bad input file as a config error."""

from __future__ import annotations

from agentrl.config import ConfigError


class DataError(ConfigError):
    """A task, text or stage-dataset file that cannot be used; the message names the config key, file and line."""
