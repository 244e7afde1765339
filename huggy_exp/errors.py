"""The two ways a job stops early: the user asked for something wrong, or the machine cannot do it."""


class UserError(Exception):
    """A bad value at a boundary (config, file, observation); the message is one line for the user."""


class Unsupported(Exception):
    """The requested device or dtype is not available here; the job is recorded as skipped, not failed."""


def first_line(exc: BaseException) -> str:
    """An exception's first line (its type's name when it has no message): what a one-line reason quotes. A first line
    that only announces what follows (dynamo's `backend='npu' raised:`, then the compiler's own error) takes the next."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()] or [type(exc).__name__]
    return f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]
