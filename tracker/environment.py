"""Fingerprint of the environment an attempt ran in (versions, CPU, providers)."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path

_PACKAGES = ("onnxruntime", "onnx", "numpy", "mlflow", "onnxscript", "skl2onnx", "scikit-learn", "torch", "transformers")


def fingerprint() -> dict[str, str]:
    """Versions, execution providers, CPU model and core count, as `env.*` strings."""
    import onnxruntime

    env = {
        "env.python": platform.python_version(),
        "env.platform": platform.platform(),
        "env.cpu_model": cpu_model(),
        "env.cpu_count": str(os.cpu_count() or 0),
        "env.ort_providers": ",".join(onnxruntime.get_available_providers()),
    }
    for package in _PACKAGES:
        try:
            env[f"env.{package}"] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return env


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo, else what `platform` knows."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()
