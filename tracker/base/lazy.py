"""Public names of a package imported on first use (PEP 562), so that importing the package stays cheap."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from importlib import import_module


def lazy_exports(package: str, by_module: Mapping[str, Sequence[str]]) -> tuple[list[str], Callable[[str], object]]:
    """`package`'s `__all__` and its module `__getattr__`, which imports a public name's module when the name is first
    read.

    Args:
        by_module: the public names each module defines; `public=attribute` where the public name is not the
            module's own (`"tolerances=task_tolerances"`).
    """
    where = {}
    for module, names in by_module.items():
        for name in names:
            public, _, attribute = name.partition("=")
            where[public] = (module, attribute or public)

    def __getattr__(name: str) -> object:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attribute = where[name]
        return getattr(import_module(module), attribute)

    return sorted(where), __getattr__
