"""User-facing errors: one line that names the file or location and what is wrong."""

import re

__all__ = [
    "PileshuffleError",
    "InputError",
    "OutputError",
    "UsageError",
    "IntegrityError",
    "user_message",
    "find_error",
    "unwrapped",
    "HOLD_WORKER_STDERR",
]

# Set by the command line, read where a local run starts (``engine/runner``): the local workers'
# stderr is held back when the error is one of ours, which is then reported in one line.
HOLD_WORKER_STDERR = {"on": False}


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


class UsageError(PileshuffleError):
    """A command-line option or its value is wrong: the message names the option."""


class IntegrityError(PileshuffleError):
    """What was written does not account for what was read."""


_WRAPPED = re.compile(
    r"(?:InputError|OutputError|UsageError|IntegrityError|PileshuffleError): (.+)"
)
_RUNNER_SUFFIX = re.compile(r"\s*\[while running '[^\]]*'\]\s*$")  # Beam appends the failing step


def user_message(error: BaseException):
    """The user-facing message of ``error``, also when a runner re-raised it wrapped in
    another exception's text; None when it is not one of ours."""
    ours = find_error(error)
    if ours is not None:
        return _RUNNER_SUFFIX.sub("", str(ours))
    matches = _WRAPPED.findall(str(error))
    return _RUNNER_SUFFIX.sub("", matches[-1]).strip().strip("'\"") if matches else None


def find_error(error: BaseException):
    """Our own error object in ``error``'s cause/context chain (in-process runners keep
    it there), or None."""
    seen, hops = error, 0
    while seen is not None and hops < 50:
        if isinstance(seen, PileshuffleError):
            return seen
        seen, hops = seen.__cause__ or seen.__context__, hops + 1
    return None


def unwrapped(error: BaseException):
    """Our error in ``error``'s chain, without the step name a runner appended to its
    message (Beam re-creates one-argument exceptions with ``[while running '...']``)."""
    ours = find_error(error)
    if ours is None:
        return None
    text = _RUNNER_SUFFIX.sub("", str(ours))
    if text != str(ours) and not isinstance(ours, InputError):
        try:
            ours = type(ours)(text)
        except Exception:
            pass
    return ours
