"""What an attempt's feeds were, as plain data: each input's name, dtype and shape, and a digest of the values.

The run logs it as its MLflow dataset input (`tracker.store.write`); the arrays themselves are never copied or
uploaded, however large they are.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FeedSpec:
    """One input: its name, dtype (numpy's name, e.g. "float32"), shape, and how many of its values are NaN or
    infinite."""

    name: str
    dtype: str
    shape: list[int]
    nbytes: int
    nonfinite: int = 0

    def describe(self) -> str:
        """e.g. "int64 [1, 32]"."""
        return f"{self.dtype} [{', '.join(str(d) for d in self.shape)}]"


@dataclass(frozen=True)
class FeedsDescription:
    """The feeds of an attempt, described.

    Attributes:
        digest: 8 hex digits of a SHA-256 over every input's name, dtype, shape and bytes: the same
            feeds give the same digest, in any process (MLflow keeps one dataset per name and digest).
        inputs: one `FeedSpec` per input, sorted by name.
    """

    digest: str
    inputs: list[FeedSpec]

    @property
    def nbytes(self) -> int:
        return sum(spec.nbytes for spec in self.inputs)

    @property
    def nonfinite(self) -> int:
        """NaN and infinite values over every input (missing values in real data, often)."""
        return sum(spec.nonfinite for spec in self.inputs)

    def nonfinite_text(self) -> str:
        """e.g. "2 NaN or infinite values (X: 2)"; "" when every value is finite."""
        if not self.nonfinite:
            return ""
        per_input = ", ".join(f"{s.name}: {s.nonfinite}" for s in self.inputs if s.nonfinite)
        return f"{self.nonfinite} NaN or infinite values ({per_input})"

    @classmethod
    def from_dict(cls, data: Mapping) -> FeedsDescription:
        """From `dataclasses.asdict`'s form (a record read back from JSON)."""
        return cls(digest=data["digest"], inputs=[FeedSpec(**spec) for spec in data["inputs"]])


def describe_feeds(feeds: Mapping[str, np.ndarray]) -> FeedsDescription:
    """The names, dtypes and shapes of `feeds`, their count of NaN and infinite values, and a digest of their
    values."""
    digest = hashlib.sha256()
    inputs = []
    for name in sorted(feeds):
        array = np.asarray(feeds[name])
        spec = FeedSpec(name=name, dtype=str(array.dtype), shape=[int(d) for d in array.shape],
                        nbytes=int(array.nbytes), nonfinite=_count_nonfinite(array))
        digest.update(f"{spec.name}\0{spec.dtype}\0{spec.shape}\0".encode())
        if array.dtype.kind == "O":  # strings as objects: hash their text, not the pointers
            digest.update("\0".join(map(str, array.ravel())).encode())
        else:
            digest.update(np.ascontiguousarray(array).reshape(-1).data)  # reshape: a 0-d array is no buffer
        inputs.append(spec)
    return FeedsDescription(digest=digest.hexdigest()[:8], inputs=inputs)


def _count_nonfinite(array: np.ndarray, chunk: int = 2**22) -> int:
    """NaN and infinite values of a float array, counted in chunks: a mask of the whole would add a quarter
    of a float32 feed's size."""
    if array.dtype.kind not in "fc":
        return 0
    flat = array.reshape(-1)
    return sum(int(part.size - np.count_nonzero(np.isfinite(part)))
               for part in (flat[i:i + chunk] for i in range(0, flat.size, chunk)))
