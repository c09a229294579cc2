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
        "env.huge_pages": huge_pages(),
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


# glibc's malloc asks the kernel for transparent huge pages (madvise) on the memory it maps. Large
# models' weights then sit on 2 MB pages: on the project's VMs gpt2-small ran ~30 % faster with it, and
# two sessions of one model stopped differing by up to 20 % (see tracker/measure/speedup.py).
HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"
_THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_pages() -> str:
    """Whether ORT's weights get transparent huge pages in this process: "always" (the kernel gives
    them to every allocation), "malloc" (GLIBC_TUNABLES asks glibc's malloc for them and the kernel's
    mode allows it), "off", or "unknown" (no Linux THP)."""
    try:
        mode = _THP_MODE.read_text().split("[", 1)[1].split("]", 1)[0]
    except (OSError, IndexError):
        return "unknown"
    if mode == "always":
        return "always"
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    asked = any(t.strip() in (HUGE_PAGES_TUNABLE, "glibc.malloc.hugetlb=2") for t in tunables.split(":"))
    return "malloc" if asked and mode == "madvise" else "off"


def with_huge_pages(environ: dict[str, str]) -> dict[str, str]:
    """A copy of `environ` for a child process whose malloc asks for huge pages (GLIBC_TUNABLES is read
    when a process starts, so it cannot be turned on in the running one)."""
    tunables = [t for t in environ.get("GLIBC_TUNABLES", "").split(":")
                if t and not t.startswith("glibc.malloc.hugetlb=")]
    return {**environ, "GLIBC_TUNABLES": ":".join([HUGE_PAGES_TUNABLE, *tunables])}
