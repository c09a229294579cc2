"""MLflow-safe metric and artifact names derived from arbitrary op and node names."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

MAX_KEY_LENGTH = 250
_DISALLOWED = re.compile(r"[^A-Za-z0-9_\-. :/]")
_REPEATS = re.compile(r"/{2,}|\.{2,}")
# A lone "." path segment ("a/./b", "x/.", "."): MLflow rejects keys that posixpath.normpath changes.
_DOT_SEGMENT = re.compile(r"(?<![^/])\.(?![^/])")
_FILE_DISALLOWED = re.compile(r"[^A-Za-z0-9_\-.]")


def sanitize_key(name: str) -> str:
    """Maps any text to a key MLflow accepts (letters, digits, `_ - . space : /`, no `//`, `..`).

    Names that had to change get a short hash of the original, so two names that only differ in
    characters MLflow rejects (`a+b`, `a=b`) do not collide.
    """
    clean = _REPEATS.sub("_", _DISALLOWED.sub("_", name)).strip("/ ")
    clean = _DOT_SEGMENT.sub("_", clean)
    if not clean:
        clean = "_"
    if clean != name:
        clean = f"{clean}_{_short_hash(name)}"
    if len(clean) > MAX_KEY_LENGTH:
        clean = f"{clean[: MAX_KEY_LENGTH - 9]}_{_short_hash(name)}"
    return clean


def metric_keys(prefix: str, names: Iterable[str], suffix: str) -> dict[str, str]:
    """`{name: f"{prefix}.{sanitized name}.{suffix}"}` for each name, all within MLflow's limits."""
    room = MAX_KEY_LENGTH - len(prefix) - len(suffix) - 2
    keys = {}
    for name in names:
        part = sanitize_key(name)
        if len(part) > room:
            part = f"{part[: room - 9]}_{_short_hash(name)}"
        keys[name] = f"{prefix}.{part}.{suffix}"
    return keys


def safe_filename(name: str, *, max_length: int = 100) -> str:
    """A single path component from any text: no separators, no `..`, never empty."""
    clean = _FILE_DISALLOWED.sub("_", name).strip(".") or "_"
    if clean != name or len(clean) > max_length:
        clean = f"{clean[: max_length - 9]}_{_short_hash(name)}"
    return clean


def _short_hash(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:8]
