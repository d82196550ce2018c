"""Package attributes imported on first use (PEP 562), so the front door stays light.

`import nodes.kernel.messages` runs `memory/__init__.py` first; if that imported
every public name, reading a transcript would load Chroma (most of a second),
and `cyrene --help` would load the whole loop. A package lists its public
names with the module each lives in, and `lazy_exports` imports a module only
when one of its names is first asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, whose names `exports` maps to their modules.

    Args:
        package: the package's `__name__`.
        exports: public name → the module that defines it, or `"module:attribute"` when
            the name is an alias.

    Returns:
        The module-level `__getattr__` and `__dir__` to assign in the package.

    Example:
        >>> __getattr__, __dir__ = lazy_exports(__name__, {"MemoryStore": "memory.store"})
    """
    namespace = import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        where = exports.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = where.partition(":")
        value = getattr(import_module(module), attribute or name)
        namespace[name] = value  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
