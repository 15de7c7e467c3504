"""User-facing errors: one line that names the file or location and what is wrong."""

import re


class PileshuffleError(Exception):
    """Base class; ``str(error)`` is the whole message shown to the user."""


class InputError(PileshuffleError):
    """Bad input: the message names the file (and the byte offset where one is known)."""

    def __init__(self, path, problem, offset=None):
        self.path, self.problem, self.offset = path, problem, offset
        where = f"{path}" if offset is None else f"{path} at byte offset {offset}"
        super().__init__(f"{where}: {problem}")

    def __reduce__(self):
        return (InputError, (self.path, self.problem, self.offset))


class OutputError(PileshuffleError):
    """The output or temp location cannot be used as asked."""


class IntegrityError(PileshuffleError):
    """What was written does not account for what was read."""


_WRAPPED = re.compile(r"(?:InputError|OutputError|IntegrityError|PileshuffleError): (.+)")


def user_message(error: BaseException):
    """The user-facing message of ``error``, also when a runner re-raised it wrapped in
    another exception's text; None when it is not one of ours."""
    seen = error
    while seen is not None:
        if isinstance(seen, PileshuffleError):
            return str(seen)
        seen = seen.__cause__ or seen.__context__
    matches = _WRAPPED.findall(str(error))
    return matches[-1].strip().strip("'\"") if matches else None
