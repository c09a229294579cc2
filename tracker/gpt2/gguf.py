"""Turning a GGUF file (llama.cpp's one-file format, usually quantized) into a plain Hugging Face folder that the causal-LM
loader reads like any other: dequantized to float32 once, and cached by the file's digest."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracker.base.errors import ModelError

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'onnx-optimization-tracker[lm]'"
# Every GGUF file starts with these 4 bytes: a file is recognised by them, whatever its name.
MAGIC = b"GGUF"
# The converted folder's name carries this many hex digits of the file's sha256: 48 bits, no collision in practice.
DIGEST_CHARS = 12
# Written into a converted folder last, before it is renamed into place: what the folder was made from. A second call
# reads it instead of the GGUF header (the header of a 100 MB file takes seconds to parse: its vocabulary is in it).
SUMMARY_FILE = "gguf_source.json"
_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class GGUFSource:
    """A GGUF file and the plain Hugging Face folder it was converted to.

    Attributes:
        gguf_path: the GGUF file, as the caller named it (a symlink is not followed).
        folder: the converted folder: config.json, float32 safetensors weights and the tokenizer.
        sha256: the file's hex digest.
        file_type: what the file says it mostly holds (`general.file_type`): "Q4_1", "Q8_0", "F16", "F32", ...
        tensor_types: how many tensors of each type it holds, most first: "Q4_1:210,F32:61,Q8_0:1".
        architecture: its `general.architecture`, llama.cpp's name ("llama", "qwen2", "gpt2", ...).
    """

    gguf_path: Path
    folder: Path
    sha256: str
    file_type: str
    tensor_types: str
    architecture: str

    def params(self) -> dict[str, str]:
        """What to log as MLflow params (`lm.gguf.*` keys; each value far below MLflow's 6,000 characters)."""
        return {"lm.gguf.file": str(self.gguf_path), "lm.gguf.sha256": self.sha256,
                "lm.gguf.file_type": self.file_type, "lm.gguf.tensor_types": self.tensor_types,
                "lm.gguf.architecture": self.architecture}


def local_folder(model: str) -> tuple[str, GGUFSource | None]:
    """The Hugging Face folder (or cached name) to load for `model`, and the GGUF it was converted from, if any.

    Args:
        model: a GGUF file, a folder holding one GGUF file and no config.json, or anything `from_pretrained` reads
            (returned as it is, with None).

    Raises:
        ModelError: as `resolve_gguf`.
    """
    source = resolve_gguf(model)
    return (model, None) if source is None else (str(source.folder), source)


def resolve_gguf(model: str) -> GGUFSource | None:
    """The plain folder of a GGUF file, converted on the first call and reused on the next ones.

    The folder goes beside the file (`<dir>/<file stem>.hf-<digest12>/`), or, when that directory is not writable,
    under `$XDG_CACHE_HOME` (else `~/.cache`) `/onnx-optimization-tracker/gguf/<digest12>/`. It is written under a
    temporary name and renamed when complete, so an interrupted conversion never leaves a folder that looks done.

    Args:
        model: a GGUF file (named `*.gguf`, or starting with GGUF's magic bytes), or a folder holding exactly one
            `*.gguf` file and no config.json.

    Returns:
        The file and its folder, or None when `model` is neither (the caller loads it as it is).

    Raises:
        ModelError: the `gguf` package is missing, the file is not readable GGUF, transformers cannot read its
            architecture, or a folder holds several GGUF files.
    """
    path = find_gguf(model)
    if path is None:
        return None
    digest = file_sha256(path)
    for folder in _candidate_folders(path, digest):
        if folder.is_dir():
            logger.info("GGUF %s: reusing its converted folder %s", path, folder)
            return _source(path, folder, digest, _read_summary(folder))
    summary = read_gguf_header(path)
    folder = _convert(path, digest, summary)
    return _source(path, folder, digest, summary)


def find_gguf(model: str) -> Path | None:
    """The GGUF file `model` names (itself, or the one `*.gguf` of a folder without config.json), or None.

    Raises:
        ModelError: a folder without config.json holds more than one GGUF file.
    """
    path = Path(model)
    if path.is_file():
        return path if path.suffix.lower() == ".gguf" or _starts_with_magic(path) else None
    if not path.is_dir() or (path / "config.json").exists():
        return None
    files = sorted(p for p in path.iterdir() if p.suffix.lower() == ".gguf" and p.is_file())
    if len(files) > 1:
        raise ModelError(f"{model!r} holds {len(files)} GGUF files ({', '.join(p.name for p in files)}) and no "
                         f"config.json; pass one of the files")
    return files[0] if files else None


def file_sha256(path: Path) -> str:
    """The hex sha256 digest of a file, read in chunks (a GGUF file can be many GB)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def read_gguf_header(path: Path) -> dict[str, str]:
    """What a GGUF file's header says of it: `architecture`, `file_type`, `tensor_types` (see `GGUFSource`).

    Raises:
        ModelError: the `gguf` package is missing, the file is not readable GGUF, or transformers cannot read its
            architecture (the message names it and the ones it can).
    """
    try:
        from gguf import GGUFReader
    except ImportError as e:
        raise ModelError(f"reading the GGUF file {str(path)!r} needs the gguf package: {INSTALL_HINT}") from e
    try:
        reader = GGUFReader(path)
        architecture = str(reader.fields["general.architecture"].contents())
    except (OSError, ValueError, KeyError) as e:  # not GGUF (ValueError), no architecture (KeyError)
        raise ModelError(f"{str(path)!r} is not a readable GGUF file ({_first_line(e)})") from e
    readable = readable_architectures()
    # transformers spells llama.cpp's "gpt-oss" and "minimax-m2" with underscores before it looks them up
    if architecture.replace("-", "_") not in readable:
        raise ModelError(f"{str(path)!r} holds a GGUF of architecture {architecture!r}, which transformers cannot read "
                         f"from GGUF; it reads: {', '.join(readable)}")
    field = reader.fields.get("general.file_type")
    file_type = _file_type_name(None if field is None else int(field.contents()))
    counts = Counter(tensor.tensor_type.name for tensor in reader.tensors)
    tensor_types = ",".join(f"{name}:{count}" for name, count in counts.most_common())
    return {"architecture": architecture, "file_type": file_type, "tensor_types": tensor_types}


def readable_architectures() -> list[str]:
    """The GGUF architectures (llama.cpp's names) the installed transformers reads, as its GGUF loaders list them."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    # The list is the keys of transformers' config mapping, which also holds the metadata prefixes of every file.
    names = set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"}
    try:  # the newer loader (transformers 5.2x) reads a few architectures the legacy one above does not
        from transformers.integrations.gguf import GGUF_ARCHS

        names |= set(GGUF_ARCHS)
    except ImportError:
        pass
    return sorted(names)


def cache_root() -> Path:
    """Where converted folders go when the GGUF file's own directory is not writable."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")  # XDG: an empty value counts as unset
    return Path(base) / "onnx-optimization-tracker" / "gguf"


def _candidate_folders(path: Path, digest: str) -> tuple[Path, Path]:
    """Beside the file first, then the cache."""
    short = digest[:DIGEST_CHARS]
    return path.parent / f"{path.stem}.hf-{short}", cache_root() / short


def _convert(path: Path, digest: str, summary: dict[str, str]) -> Path:
    """Converts `path` into the first candidate folder whose directory is writable, and returns that folder."""
    beside, cached = _candidate_folders(path, digest)
    try:
        work = Path(tempfile.mkdtemp(prefix=f".{beside.name}.tmp-", dir=beside.parent))
        folder = beside
    except OSError as e:  # PermissionError, or EROFS on a read-only mount: os.access does not see either for root
        logger.info("GGUF %s: its directory is not writable (%s); converting into %s", path, e.strerror, cached)
        cached.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{cached.name}.tmp-", dir=cached.parent))
        folder = cached
    logger.info("GGUF %s (%s, %s): converting to a float32 folder %s", path, summary["architecture"],
                summary["file_type"], folder)
    start = time.perf_counter()
    try:
        _write_folder(path, work)
        (work / SUMMARY_FILE).write_text(json.dumps({"gguf_file": path.name, "sha256": digest, **summary}, indent=1))
        os.rename(work, folder)
    except OSError as e:
        shutil.rmtree(work, ignore_errors=True)
        if not folder.is_dir():
            raise
        # another process finished the same conversion first: its folder is as good as ours
        logger.info("GGUF %s: %s appeared meanwhile (%s); using it", path, folder, e.strerror)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    logger.info("GGUF %s: converted in %.1f s", path, time.perf_counter() - start)
    return folder


def _write_folder(path: Path, folder: Path) -> None:
    """Dequantizes `path` to float32 through transformers and saves model and tokenizer into `folder`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if importlib.util.find_spec("accelerate") is None:  # transformers' own refusal does not say how to install it
        raise ModelError(f"converting the GGUF file {str(path)!r} needs the accelerate package: {INSTALL_HINT}")
    try:
        from_gguf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=str(path), local_files_only=True,
                                                         dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as e:  # a tokenizer or tensor transformers cannot map
        raise ModelError(f"transformers cannot load the GGUF file {str(path)!r} ({_first_line(e)})") from e
    # save_pretrained refuses a model loaded from GGUF (it counts as quantized), so the weights move into a plain model
    # of the same config. Without its quantization_config: a config.json naming gguf would make from_pretrained look
    # for the GGUF file again.
    config = from_gguf.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(from_gguf.state_dict(), strict=True)
    plain.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _read_summary(folder: Path) -> dict[str, str]:
    try:
        values: dict[str, Any] = json.loads((folder / SUMMARY_FILE).read_text())
        return {key: str(values[key]) for key in ("architecture", "file_type", "tensor_types")}
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"{str(folder)!r} is not a complete GGUF conversion ({SUMMARY_FILE}: {e}); delete it to "
                         f"convert again") from e


def _source(path: Path, folder: Path, digest: str, summary: dict[str, str]) -> GGUFSource:
    return GGUFSource(gguf_path=path, folder=folder, sha256=digest, file_type=summary["file_type"],
                      tensor_types=summary["tensor_types"], architecture=summary["architecture"])


def _first_line(error: Exception) -> str:
    """What a one-line message quotes of an error from gguf or transformers (some span lines, some are empty)."""
    return (str(error).splitlines() or [type(error).__name__])[0]


def _starts_with_magic(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def _file_type_name(value: int | None) -> str:
    """The name of llama.cpp's file type `value` without its prefix (MOSTLY_Q4_1 is "Q4_1", ALL_F32 is "F32"), or
    "unknown" when the file does not say."""
    from gguf import LlamaFileType

    if value is None:
        return "unknown"
    try:
        name = LlamaFileType(value).name
    except ValueError:
        return f"unknown ({value})"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")
