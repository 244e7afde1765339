"""The two ways a job stops early: the user asked for something wrong, or the machine cannot do it."""


class UserError(Exception):
    """A bad value at a boundary (config, file, observation); the message is one line for the user."""


class Unsupported(Exception):
    """The requested device or dtype is not available here; the job is recorded as skipped, not failed."""


def first_line(exc: BaseException) -> str:
    """An exception's first line (its type's name when it has no message): what a one-line reason quotes."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
