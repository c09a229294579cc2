"""Public names of a package imported on first use (PEP 562), so that importing the package stays cheap."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module


def lazy_getattr(package: str, exports: Mapping[str, str]) -> Callable[[str], object]:
    """The module `__getattr__` of `package` that imports `exports[name]` when `name` is first read.

    `exports[name]` is the module that defines `name`, or `module:attribute` where the public name is not the
    module's (`"tolerances": "tracker.measure.accuracy.task_diff:task_tolerances"`).
    """

    def __getattr__(name: str) -> object:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = exports[name].partition(":")
        return getattr(import_module(module), attribute or name)

    return __getattr__
