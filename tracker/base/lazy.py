"""Public names of a package imported on first use (PEP 562), so that importing the package stays cheap."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module


def lazy_getattr(package: str, exports: Mapping[str, str]) -> Callable[[str], object]:
    """The module `__getattr__` of `package` that imports `exports[name]` (a module path) when `name` is first read."""

    def __getattr__(name: str) -> object:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(exports[name]), name)

    return __getattr__
