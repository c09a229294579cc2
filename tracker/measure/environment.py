"""Fingerprint of the environment an attempt ran in (versions, CPU and its instruction sets, providers)."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
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
        "env.isa": ",".join(name for name, has in isa().items() if has) or "none known",
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


# The instruction sets ONNX Runtime's int8 and int4 kernels (MLAS) dispatch on: the same int8 model runs 1.76x of
# fp32 on an AVX-512 VNNI machine and 1.32x on an AVX2 one (FACTS), so a figure means little without them. Our name
# -> the flags that mean it: Linux's /proc/cpuinfo `flags` (x86) or `Features` (Arm), macOS's `sysctl hw.optional`.
# (archspec reports the features of the nearest named microarchitecture, which can leave out AMX and AVX-VNNI.)
ISA_FLAGS = {
    "avx2": ("avx2", "hw.optional.avx2_0"),
    "avx512": ("avx512f", "hw.optional.avx512f"),
    "avx512_vnni": ("avx512_vnni", "hw.optional.avx512vnni"),
    "avx_vnni": ("avx_vnni",),
    "amx_int8": ("amx_int8",),
    "arm_dotprod": ("asimddp", "hw.optional.arm.FEAT_DotProd"),
    "arm_i8mm": ("i8mm", "hw.optional.arm.FEAT_I8MM"),
}


def isa(flags: frozenset[str] | None = None) -> dict[str, bool]:
    """Which instruction sets of `ISA_FLAGS` the CPU has (given `flags`, those; default: this machine's)."""
    flags = _cpu_flags() if flags is None else flags
    return {name: any(flag in flags for flag in names) for name, names in ISA_FLAGS.items()}


@functools.cache
def _cpu_flags() -> frozenset[str]:
    """This CPU's feature flags: /proc/cpuinfo's first `flags` or `Features` line, else macOS's `sysctl hw.optional`
    keys set to 1; empty where neither answers."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split())
    if platform.system() == "Darwin":
        try:
            out = subprocess.run(["sysctl", "hw.optional"], capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            return frozenset()
        return frozenset(key for key, _, value in (line.partition(": ") for line in out.splitlines())
                         if value.strip() == "1")
    return frozenset()


def isa_params() -> dict[str, str]:
    """The instruction sets as a study run's params: `machine.isa.<name>` = "true" or "false"."""
    return {f"machine.isa.{name}": str(has).lower() for name, has in isa().items()}


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
