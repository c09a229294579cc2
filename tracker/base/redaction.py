"""Keeps tracking credentials out of every line the process writes: its logs, MLflow's, and errors.

A tracking URI may carry a password (`http://alice:SECRET@host`, `postgresql://u:SECRET@host/db`), and
MLflow puts the URI into its own output ("View run ... at: <uri>", "API request to <uri>/api/... failed").
`protect_uri` remembers the secrets of a URI and turns MLflow's URL printing off; a log record factory
then replaces them in every log record, whichever library logs it; `redact` does it for any text.
"""

from __future__ import annotations

import logging
import os
import threading
from urllib.parse import quote, unquote, urlsplit, urlunsplit

MASK = "***"
# Credentials MLflow's client also reads from the environment (never printed by it, but redacted too).
SECRET_ENVIRONMENT = ("MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")
# MLflow prints "View run <name> at: <uri>/#/..." after each run unless this is set.
SUPPRESS_URL_PRINTING = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"

_secrets: set[str] = set()
_lock = threading.Lock()
_installed = False


def redact_uri(uri: str) -> str:
    """The URI with its password (if any) replaced by `***`."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{MASK}@{host}"))


def without_credentials(uri: str) -> str:
    """The URI with no user info at all: a link that can be shown and clicked."""
    parts = urlsplit(uri)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def protect_uri(uri: str) -> None:
    """Keeps the secrets of `uri` (and of the MLflow credential variables) out of all later output."""
    found = {os.environ.get(name, "") for name in SECRET_ENVIRONMENT}
    password = urlsplit(uri).password
    if password:
        # The URI may spell it percent-encoded; messages may show either form.
        found |= {password, unquote(password), quote(unquote(password), safe="")}
        os.environ[SUPPRESS_URL_PRINTING] = "true"  # its links would carry the password
    found = {s for s in found if len(s) >= 3}  # a 1-2 character "secret" would mask half the log
    if found:
        with _lock:
            _secrets.update(found)
        _install_log_filter()


def redact(text: str) -> str:
    """`text` with every protected secret replaced by `***`."""
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for secret in secrets:
        text = text.replace(secret, MASK)
    return text


def _install_log_filter() -> None:
    """Redacts every log record when it is made, so that it holds whichever handler writes it."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    make_record = logging.getLogRecordFactory()

    def redacting_factory(*args, **kwargs) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return record

    logging.setLogRecordFactory(redacting_factory)
