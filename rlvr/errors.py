"""User-facing errors: the CLI prints these as one clear line and exits non-zero, no traceback."""


class UserError(Exception):
    """A problem the user can fix (bad config, missing model directory, malformed task file)."""


class ConfigError(UserError):
    """A bad configuration value or key; the message names the key and what is allowed."""
