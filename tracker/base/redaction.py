"""Keeps tracking credentials out of every line the process writes: its logs, MLflow's, and errors.

A tracking URI may carry a password (`http://alice:SECRET@host`, `postgresql://u:SECRET@host/db`), a token as its
user part (`https://TOKEN@host`) or in its query (`?token=SECRET`), and MLflow puts the URI into its own output
("View run ... at: <uri>", "API request to <uri>/api/... failed"). `protect_uri` remembers the secrets of a URI (its
whole user info and credential-named query values) and turns MLflow's URL printing off; a log record factory
(`terminal.rewrite_log_records`) then replaces them in every log record, whichever library logs it; `redact` does it
for any text.
"""

from __future__ import annotations

import os
import re
import threading
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

from tracker.base.terminal import rewrite_log_records

MASK = "***"
# Credentials MLflow's client also reads from the environment (never printed by it, but redacted too).
SECRET_ENVIRONMENT = ("MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")
# MLflow prints "View run <name> at: <uri>/#/..." after each run unless this is set.
SUPPRESS_URL_PRINTING = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"

_secrets: set[str] = set()
_lock = threading.Lock()


def redact_uri(uri: str) -> str:
    """The URI with its whole user info (`user:password@`, or a token alone: `TOKEN@host`) and the value of every
    query parameter named like a credential (`credential_query_values`) replaced by `***`."""
    parts = urlsplit(uri)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{MASK}@{netloc.rpartition('@')[2]}"
    query = "&".join(f"{key}={MASK}" if _is_credential(unquote(key)) and "=" in pair else pair
                     for pair in parts.query.split("&") if pair for key in [pair.split("=", 1)[0]])
    if netloc == parts.netloc and query == parts.query:
        return uri
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def credential_query_values(uri: str) -> list[str]:
    """The values of `uri`'s query parameters whose names say they are credentials: a name holding token, key,
    secret, password, passwd, pwd, auth, credential or sig (`?token=...`, `?api_key=...`, `?sig=...`)."""
    return [value for key, value in parse_qsl(urlsplit(uri).query, keep_blank_values=True) if _is_credential(key)]


_CREDENTIAL_WORDS = ("token", "key", "secret", "password", "passwd", "pwd", "auth", "credential", "sig")


def _is_credential(name: str) -> bool:
    return any(word in name.lower() for word in _CREDENTIAL_WORDS)


def without_credentials(uri: str) -> str:
    """The URI with no user info at all: a link that can be shown and clicked."""
    parts = urlsplit(uri)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def protect_uri(uri: str) -> None:
    """Keeps the secrets of `uri` (and of the MLflow credential variables) out of all later output."""
    found = {os.environ.get(name, "") for name in SECRET_ENVIRONMENT}
    parts = urlsplit(uri)
    # The password, or a user part that is a token on its own (`https://TOKEN@host`), and credential query values.
    # A user name beside a password is not a secret of its own: masking it everywhere would mask "postgres" in
    # "postgresql://"; `redact` masks every URI's user info where a URI is written.
    token = parts.username if parts.password is None else None
    credentials = [c for c in (parts.password, token, *credential_query_values(uri)) if c]
    for secret in credentials:
        # The URI may spell it percent-encoded; messages may show either form.
        found |= {secret, unquote(secret), quote(unquote(secret), safe="")}
    if credentials:
        os.environ[SUPPRESS_URL_PRINTING] = "true"  # its links would carry them
    found = {s for s in found if len(s) >= 3}  # a 1-2 character "secret" would mask half the log
    if found:
        with _lock:
            _secrets.update(found)
        # in each log record when it is made, whichever handler writes it (MLflow's tracebacks included)
        rewrite_log_records(redact, exceptions=True)


def redact(text: str) -> str:
    """`text` with every protected secret, and the user info of every URI in it, replaced by `***`."""
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for secret in secrets:
        text = text.replace(secret, MASK)
    return _USER_INFO.sub(rf"\1{MASK}@", text)


# `scheme://user:password@` or `scheme://TOKEN@` in any text (not an e-mail address: it follows "://").
_USER_INFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@?#]+@")
