"""The model registry, read: a `models:/NAME@ALIAS` or `models:/NAME/VERSION` URI resolved to its version in the
tracking store (or one line naming what exists there), and that version's ONNX file downloaded."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import mlflow
from mlflow.exceptions import MlflowException

from tracker.base.errors import ModelError, TrackingServerError
from tracker.base.redaction import redact_uri
from tracker.store.faults import describe
from tracker.store.read import no_progress_bar

MODELS_SCHEME = "models:/"
# models:/NAME@ALIAS or models:/NAME/VERSION; MLflow's names may hold most characters but "/" and "@" end them here.
_MODELS_URI = re.compile(r"models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>[^/@]+))")
_NOT_FOUND = ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND")
# What an MLmodel names as the onnx flavor's file.
_ONNX_FLAVOR = "onnx"


@dataclass(frozen=True)
class RegisteredVersion:
    """One version of a registered model, as the registry knows it.

    Attributes:
        uri: the URI it was asked by (`models:/m@champion`).
        name: the registered model.
        version: its version number, as text.
        aliases: the aliases pointing at this version.
        run_id: the run that logged it, if any.
        source: where its files live (a logged model's `models:/m-...`, or a run's artifact path).
    """

    uri: str
    name: str
    version: str
    aliases: tuple[str, ...]
    run_id: str | None
    source: str

    def identity(self) -> dict[str, object]:
        """What names this version, JSON-ready."""
        return {"uri": self.uri, "name": self.name, "version": self.version, "aliases": list(self.aliases),
                "run_id": self.run_id, "source": self.source}


def is_models_uri(text: str) -> bool:
    """Whether `text` names a registered model (`models:/...`) rather than a file."""
    return text.startswith(MODELS_SCHEME)


def parse_models_uri(uri: str) -> tuple[str, str | None, str | None]:
    """(name, version, alias) of `models:/NAME/VERSION` or `models:/NAME@ALIAS`; one of version and alias is None.

    Raises:
        ValueError: `uri` is neither form.
    """
    match = _MODELS_URI.fullmatch(uri)
    if match is None:
        raise ValueError(f"{uri!r} names no registered model's version: expected models:/NAME@ALIAS or "
                         "models:/NAME/VERSION")
    return match["name"], match["version"], match["alias"]


def resolve_version(uri: str) -> RegisteredVersion:
    """The version `uri` names in the current tracking store.

    Raises:
        ValueError: `uri` is malformed, or names a model, version or alias that does not exist: the line names the
            registered models, or that model's versions and aliases.
    """
    name, version, alias = parse_models_uri(uri)
    client = mlflow.MlflowClient()
    with _read_failures(uri):
        return _resolve(client, uri, name, version, alias)


def _resolve(client: mlflow.MlflowClient, uri: str, name: str, version: str | None, alias: str | None
             ) -> RegisteredVersion:
    try:
        registered = client.get_registered_model(name)
    except MlflowException as e:
        if e.error_code not in _NOT_FOUND:
            raise
        names = sorted(m.name for m in client.search_registered_models())
        where = redact_uri(mlflow.get_tracking_uri())
        raise ValueError(f"{uri}: no registered model {name!r} in the tracking store {where}; "
                         f"{'its registered models: ' + ', '.join(names) if names else 'it holds no registered model'}"
                         ) from None
    try:
        found = (client.get_model_version(name, version) if version is not None
                 else client.get_model_version_by_alias(name, str(alias)))
    except MlflowException as e:
        if e.error_code not in _NOT_FOUND:
            raise
        missing = f"no version {version!r}" if version is not None else f"no alias {alias!r}"
        raise ValueError(f"{uri}: registered model {name!r} has {missing}; {_what_exists(client, registered)}"
                         ) from None
    return RegisteredVersion(uri=uri, name=name, version=str(found.version), aliases=tuple(found.aliases or ()),
                             run_id=found.run_id or None, source=str(found.source))


@contextlib.contextmanager
def _read_failures(uri: str) -> Iterator[None]:
    """A read of the registry that fails for another reason than a missing name (the store went away, refused the
    credentials, has no registry) as one line."""
    try:
        yield
    except (MlflowException, OSError) as e:
        raise TrackingServerError(f"{uri}: reading the model registry of the tracking store "
                                  f"{redact_uri(mlflow.get_tracking_uri())} failed ({describe(e)})") from e


def _what_exists(client: mlflow.MlflowClient, registered) -> str:
    """`its versions: 1, 2; its aliases: champion (version 1)`."""
    versions = sorted(int(v.version) for v in client.search_model_versions(f"name='{_quote(registered.name)}'"))
    aliases = sorted((registered.aliases or {}).items())
    shown = ", ".join(f"{a} (version {v})" for a, v in aliases) or "none"
    return f"its versions: {', '.join(map(str, versions)) or 'none'}; its aliases: {shown}"


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def download_onnx(version: RegisteredVersion, folder: Path) -> Path:
    """Downloads the version's files into `folder`; the path of its ONNX file (its external data beside it).

    The file is the one the onnx flavor names in the version's MLmodel; without that flavor, its one `.onnx` file.

    Raises:
        ModelError: the version holds no ONNX file, or several without an onnx flavor to choose.
    """
    uri = f"{MODELS_SCHEME}{version.name}/{version.version}"
    with no_progress_bar(), _read_failures(version.uri):
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(folder)))
    if local.is_file():
        return local
    named = _flavor_file(local)
    if named is not None:
        return named
    files = sorted(local.rglob("*.onnx"))
    if len(files) != 1:
        held = ", ".join(str(p.relative_to(local)) for p in sorted(local.rglob("*")) if p.is_file())[:300]
        raise ModelError(f"{version.uri} (registered model {version.name!r} version {version.version}) holds "
                         f"{'no' if not files else len(files)} .onnx files and no onnx flavor to choose one; "
                         f"its files: {held or 'none'}")
    return files[0]


def _flavor_file(folder: Path) -> Path | None:
    """The file the onnx flavor of `folder/MLmodel` names, if there is one."""
    from mlflow.models import Model

    if not (folder / "MLmodel").is_file():
        return None
    flavor = Model.load(str(folder / "MLmodel")).flavors.get(_ONNX_FLAVOR) or {}
    data = flavor.get("data")
    path = (folder / str(data)).resolve() if data else None
    inside = path is not None and path.is_relative_to(folder.resolve())  # an MLmodel naming "../x" names nothing
    return path if inside and path is not None and path.is_file() else None
