"""Feeds read from numpy files (`.npz` by input name, `.npy` for one input), checked against the model."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np
import onnx

from tracker.errors import FeedError
from tracker.measure.feeds import check_feeds, check_indices, input_specs


def load_feeds(path: str | os.PathLike[str], model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Reads feeds from a numpy file and checks them against the model.

    A `.npz` (`numpy.savez`) holds one array per input, by name; a `.npy` (`numpy.save`) holds one array, for a
    model with exactly one input. The content decides, not the extension. Arrays of Python objects are refused:
    reading them would unpickle the file, which can run any code.

    Args:
        path: the `.npz` or `.npy` file.
        model: the model the feeds are for.

    Returns:
        The feeds by input name.

    Raises:
        FeedError: naming the file, when it is missing, not a numpy file, unreadable or corrupt, holds object
            arrays, holds one array for a model of several inputs, does not match the model (`check_feeds`), or
            holds integers outside a table they index (`check_indices`).
    """
    path = Path(path)
    loaded = _load_numpy(path)
    if isinstance(loaded, np.ndarray):
        feeds = {_only_input(model, path): loaded}
    else:
        feeds = _read_archive(path, loaded)
    try:
        check_feeds(model, feeds)
        check_indices(model, feeds)
    except FeedError as e:
        raise FeedError(f"feeds file {str(path)!r}: {e}") from e
    return feeds


_EXPECTED_FILE = "expected a .npz of arrays by input name (numpy.savez) or a .npy of one array (numpy.save)"


def _load_numpy(path: Path) -> np.ndarray | np.lib.npyio.NpzFile:
    if not path.is_file():
        state = "is not a file" if path.exists() else "does not exist"
        raise FeedError(f"feeds file {str(path)!r} {state}; {_EXPECTED_FILE}")
    with path.open("rb") as file:
        head = file.read(len(np.lib.format.MAGIC_PREFIX))
    # numpy reads anything else as a pickle; say what the file is not instead of numpy's pickle message.
    if not (head.startswith(b"PK") or head == np.lib.format.MAGIC_PREFIX):
        raise FeedError(f"feeds file {str(path)!r} is neither a .npz archive nor a .npy array; {_EXPECTED_FILE}")
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise FeedError(f"cannot read feeds file {str(path)!r}: {e}; {_EXPECTED_FILE} of numbers "
                        "(object arrays are refused: reading them would unpickle)") from e


def _read_archive(path: Path, archive: np.lib.npyio.NpzFile) -> dict[str, np.ndarray]:
    feeds = {}
    with archive:
        for name in archive.files:
            try:
                value = archive[name]
            except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
                raise FeedError(f"cannot read array {name!r} of feeds file {str(path)!r}: {e}; expected arrays of "
                                "numbers (object arrays are refused: reading them would unpickle)") from e
            if not isinstance(value, np.ndarray):
                raise FeedError(f"member {name!r} of feeds file {str(path)!r} is not a .npy array; {_EXPECTED_FILE}")
            feeds[name] = value
    return feeds


def _only_input(model: onnx.ModelProto, path: Path) -> str:
    names = [spec.name for spec in input_specs(model)]
    if len(names) != 1:
        raise FeedError(f"feeds file {str(path)!r} holds one array (.npy), but the model has {len(names)} inputs "
                        f"{names}; save them by name in a .npz: numpy.savez(path, **feeds)")
    return names[0]
