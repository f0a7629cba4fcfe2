"""One error hierarchy for egolake.

`InputError` marks a problem with an input file: ingest turns it into a `quarantine` row.
`MetadataError` marks damaged embedded metadata: ingest records it as a warning on the episode.
Every other `EgolakeError` raised while processing an episode is caught once, in
`udfs.guard.guarded`, and becomes a `failed` row in the `runs` table; the batch goes on.
"""

from __future__ import annotations

__all__ = [
    "CompatibilityError",
    "EgolakeError",
    "InputError",
    "MetadataError",
    "ModelError",
    "NotConvergedError",
    "ShapeError",
]


class EgolakeError(Exception):
    """Base class of every error egolake raises on purpose."""


class InputError(EgolakeError):
    """An input file cannot become an episode.

    Args:
        reason_code: short machine-readable code, one of `udfs.media.reasons.REASONS`.
        message: human-readable sentence naming the problem (and the fix when there is one).
        path: the offending file.
    """

    def __init__(self, reason_code: str, message: str, path: str = "") -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.reason_code = reason_code
        self.message = message
        self.path = path

    def __reduce__(self) -> tuple[type[InputError], tuple[str, str, str]]:
        """Pickle by the constructor's arguments (a decoding child process sends its errors to the parent)."""
        return type(self), (self.reason_code, self.message, self.path)


class MetadataError(EgolakeError):
    """Metadata embedded in an input (e.g. a GoPro GPMF track) is damaged or cannot be used.

    Unlike `InputError` it never quarantines the input: the episode keeps its video and the
    metadata is left out, with this message recorded as a warning.
    """


class ShapeError(EgolakeError):
    """An array does not have the documented shape.

    ``actual_shape`` is one array's shape, or a tuple of shapes when several arrays are checked together.
    """

    def __init__(
        self, message: str, actual_shape: tuple[int, ...] | tuple[tuple[int, ...], ...], expected_shape: str
    ) -> None:
        super().__init__(f"{message}: expected {expected_shape}. Got {actual_shape}")
        self.actual_shape = actual_shape
        self.expected_shape = expected_shape


class ModelError(EgolakeError):
    """A model file uses something its reader does not support (an operator, a tensor type)."""


class NotConvergedError(EgolakeError):
    """A solver stopped without meeting its tolerance and the caller needs it to."""


class CompatibilityError(EgolakeError):
    """Stored data or config is from an incompatible version; the message gives the fix."""
