"""Which globals a ring reader's unpickler may load (clause ring.payload.pickle-allow-list).

vLLM's ring carries pickle, so a reader must unpickle; but unpickling calls whatever globals the
stream names. The reference reader resolves a global only when the spec's
``pickle_allowed_globals`` list (``spec/data/ring.toml``) names it:

- ``module.name``: exactly that global;
- ``module.*``: any *class* defined in ``module`` or a submodule of it (a function or module
  there is refused), e.g. ``vllm.*`` for vLLM's message structs and enums.

Two globals are replaced by guarded stand-ins: ``importlib.import_module`` loads only vLLM's ring
module (as a stand-in holding :func:`.payload.rebuild_tensor`), and ``builtins.getattr`` reads
only ``_rebuild_tensor`` from it; that pair is how a writer names vLLM's tensor rebuild without
importing vLLM. Anything else raises :class:`~enginewire.reference.errors.UnsafePickleError`
before any of the stream's code runs.
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable, Iterable
from typing import Any

from enginewire.spec import load

from ..errors import UnsafePickleError

CLAUSE = "ring.payload.pickle-allow-list"


def _refuse(module: str, name: str, why: str) -> UnsafePickleError:
    return UnsafePickleError(CLAUSE, f"the payload names the global {module}.{name}: {why}",
                             expected="a global of the allow-list", got=f"{module}.{name}")


class AllowList:
    """Resolves ``(module, name)`` pairs the way :meth:`pickle.Unpickler.find_class` does, for
    allowed globals only. ``special`` maps pairs to stand-ins returned as they are."""

    def __init__(self, entries: Iterable[str],
                 special: dict[tuple[str, str], Any] | None = None) -> None:
        self.exact: set[tuple[str, str]] = set()
        self.class_prefixes: tuple[str, ...] = ()
        prefixes: list[str] = []
        for entry in entries:
            if entry.endswith(".*"):
                prefixes.append(entry[:-2])
            else:
                module, _, name = entry.rpartition(".")
                self.exact.add((module, name))
        self.class_prefixes = tuple(prefixes)
        self._resolved: dict[tuple[str, str], Any] = dict(special or {})

    def find_class(self, module: str, name: str) -> Any:
        key = (module, name)
        found = self._resolved.get(key, _MISSING)
        if found is not _MISSING:
            return found
        return self._resolve(key)

    def _resolve(self, key: tuple[str, str]) -> Any:
        module, name = key
        exact = key in self.exact
        if not exact and not any(module == p or module.startswith(p + ".")
                                 for p in self.class_prefixes):
            raise _refuse(module, name, "not in the allow-list")
        if "." in name and not exact:
            raise _refuse(module, name, "a dotted name is allowed only when listed exactly")
        try:
            target = importlib.import_module(module)
            for part in name.split("."):
                target = getattr(target, part)
        except (ImportError, AttributeError) as exc:
            raise _refuse(module, name, f"cannot be loaded ({exc})") from None
        if not exact and not isinstance(target, type):
            raise _refuse(module, name, "only classes are allowed under a module prefix")
        self._resolved[key] = target
        return target


_MISSING = object()


def spec_entries(version: str | None = None) -> list[str]:
    """The ``pickle_allowed_globals`` of the ring surface."""
    return list(load(version).surface("ring").pickle_allowed_globals)


def guarded_import(allowed: dict[str, Any]) -> Callable[[str], Any]:
    """A stand-in for ``importlib.import_module`` that returns ``allowed[name]`` only."""

    def import_module(name: str, package: str | None = None) -> Any:
        if package is None and name in allowed:
            return allowed[name]
        raise _refuse("importlib", "import_module", f"importing {name!r} is not allowed")

    return import_module


def guarded_getattr(allowed: dict[int, frozenset[str]]) -> Callable[..., Any]:
    """A stand-in for ``builtins.getattr`` that reads only the listed attributes of the listed
    objects (by identity), and the members of an Enum class (how Python 3.12+ pickles an enum
    member whose class the allow-list resolved)."""

    def getattr_(obj: Any, name: str, *default: Any) -> Any:
        if isinstance(obj, enum.EnumMeta) and isinstance(name, str) and name in obj.__members__:
            return obj.__members__[name]
        names = allowed.get(id(obj))
        if names is None or name not in names:
            raise _refuse("builtins", "getattr", f"reading {name!r} is not allowed")
        return getattr(obj, name)

    return getattr_

