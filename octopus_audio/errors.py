"""Error types that the CLI turns into one clear sentence and an exit code (2: bad input, 1: failure), and the
one prefix every such sentence starts with."""


class UsageError(ValueError):
    """Bad arguments or inputs from the user: printed as one sentence, exit code 2, no traceback."""


def error_prefix(command: str | None = None) -> str:
    """`octopus-audio COMMAND: error: ` (`octopus-audio: error: ` before a command is known): the start of
    every bad-input sentence, whether argparse or the command itself found the problem."""
    return f"octopus-audio{f' {command}' if command else ''}: error: "
