"""The tracker's own error types: each names what was wrong and what was expected."""


class TrackerError(Exception):
    """Base class of every error the tracker raises on purpose."""


class ProfileFormatError(TrackerError, ValueError):
    """A file is not an ONNX Runtime profile (empty, garbage, foreign JSON)."""


class ModelError(TrackerError, ValueError):
    """A model file cannot be read, or fails the ONNX checker."""


class FeedError(TrackerError, ValueError):
    """Feeds do not match a model's inputs (names, dtypes, ranks, unsized symbolic dims)."""


class TrackingServerError(TrackerError, ConnectionError):
    """The MLflow tracking server cannot be reached."""


class UnsupportedOpError(TrackerError, ValueError):
    """A model uses an op that the runtime asked to run it does not implement."""


class RecordError(TrackerError, ValueError):
    """A record kept in the outbox cannot be uploaded: unreadable, malformed, or naming files outside its folder."""
