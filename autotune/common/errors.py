"""Errors raised by autotune for problems a user can fix.

Library code raises these; only `autotune.cli` catches them, prints the message and exits 2.
Anything else is a bug and keeps its traceback.
"""


class AutotuneError(Exception):
    """A problem with the user's input or environment, explained in the message."""


class ConfigError(AutotuneError):
    """Bad run configuration: unknown keys, bad values. The message names every problem."""


class ModelNotFoundError(AutotuneError):
    """The model name is neither in the catalogue, a local folder, nor reachable on the hub."""


class SpaceError(AutotuneError):
    """A search space file is missing or invalid."""


class DeviceError(AutotuneError):
    """The requested device is not available, or the device probe failed."""


class DataError(AutotuneError):
    """The data or its tokenizer cannot be used; the message names the setting."""


class FactoryError(AutotuneError):
    """The trainer= factory cannot be imported or called as `function(args, model_kwargs)`."""


class StudyError(AutotuneError):
    """The study folder or storage cannot be used (missing, unreadable, incompatible)."""


class UnsafePath(StudyError):
    """A path autotune would write through is refused: a link planted at it, or a folder on
    the way another user owns or may write into."""


class OutputsNotWritten(StudyError):
    """Trials ran and are kept in the study's storage, but its outputs could not be written (a
    full disk): not a mistake in what was asked, so not exit 2."""


OUTPUTS_NOT_WRITTEN_EXIT_CODE = 73
"""sysexits' EX_CANTCREAT: an output file could not be created."""


def first_line(exc: BaseException) -> str:
    """`TypeName: the first line of its message`: an exception in one line of a message."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
