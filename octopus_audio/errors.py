"""Error types that the CLI turns into one clear sentence and an exit code (2: bad input, 1: failure)."""


class UsageError(ValueError):
    """Bad arguments or inputs from the user: printed as one sentence, exit code 2, no traceback."""
