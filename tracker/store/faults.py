"""Whether a failed write to the tracking store is an outage (try again later) or a refusal of the content.

One decision, used wherever the tracker writes: a live attempt (`tracker.api`), a part of a run
(`write.log_record`) and an upload (`tracker.upload`).

- An **outage** passes: the store is down or times out, the server answers 5xx or 429, the database is locked
  or refuses the connection. What could not be logged is kept in the outbox for `tracker upload`.
- A **refusal** stays: MLflow turns down the content itself (a value it cannot store, a signature it cannot
  build, a run whose experiment was deleted). Keeping it for later changes nothing; the run logs what it can
  and names what it could not.

MLflow's own exceptions do not always tell the two apart (a network failure and a client-side bug are both
its default INTERNAL_ERROR), so an error that names no transient cause is an outage only if the store does
not answer a read right after it.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator

import mlflow

from tracker.base.errors import TrackingServerError

# A local artifact store that is full, read-only or failing: the store's trouble, not the content's.
_STORE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})
# MLflow error codes that say "not now" whatever the content.
_TRANSIENT_CODES = frozenset({
    "TEMPORARILY_UNAVAILABLE", "DEADLINE_EXCEEDED", "REQUEST_LIMIT_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED",
    "CANCELLED", "UNAUTHENTICATED", "CUSTOMER_UNAUTHORIZED", "PERMISSION_DENIED",
})
# MLflow error codes that say "never": the request itself is at fault.
_REFUSAL_CODES = frozenset({
    "INVALID_PARAMETER_VALUE", "BAD_REQUEST", "RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS", "INVALID_STATE",
    "RESOURCE_DOES_NOT_EXIST", "NOT_FOUND", "RESOURCE_CONFLICT", "NOT_IMPLEMENTED",
})


def is_outage(error: BaseException) -> bool:
    """Whether `error`, raised by a write to the tracking store, means the store is not answering (keep the
    record and upload it later) rather than that it refused the content (log what can be, name the rest)."""
    cause = _transient_cause(error)
    if cause is not None:
        return cause
    return not _store_answers()


def _transient_cause(error: BaseException) -> bool | None:
    """True/False where the error itself says outage/refusal; None where only asking the store can tell."""
    import sqlalchemy.exc

    for e in _chain(error):
        if isinstance(e, TrackingServerError | ConnectionError | TimeoutError | sqlalchemy.exc.OperationalError
                      | sqlalchemy.exc.InterfaceError):
            return True
        if _is_requests_error(e):
            return True
        if isinstance(e, mlflow.exceptions.MlflowException):
            if e.error_code in _TRANSIENT_CODES:
                return True
            if e.error_code in _REFUSAL_CODES:
                return False
        if isinstance(e, OSError) and e.errno in _STORE_ERRNOS:
            return True
    return None


def _is_requests_error(error: BaseException) -> bool:
    import requests

    return isinstance(error, requests.exceptions.ConnectionError | requests.exceptions.Timeout)


def _chain(error: BaseException | None) -> Iterator[BaseException]:
    """The error and its causes and contexts, innermost last (each once)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__




def _store_answers() -> bool:
    """Whether the current tracking store answers one read now (a server: a read of its database)."""
    from tracker.store.connect import ensure_reachable

    try:
        ensure_reachable()
        mlflow.MlflowClient().search_experiments(max_results=1)
    except Exception:
        return False
    return True


def describe(error: BaseException, limit: int = 300) -> str:
    """`Type: first line of the message` of the innermost cause that has one (MLflow wraps a database's own
    error in a message about sessions), short enough for a tag or a log line."""
    described = [e for e in _chain(error) if str(e).strip()]
    innermost = described[-1] if described else error
    text = str(innermost).strip().splitlines()
    return f"{type(innermost).__name__}: {text[0][:limit] if text else 'no detail'}"
