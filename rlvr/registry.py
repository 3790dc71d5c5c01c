"""Registries: the extension points of rlvr, each keyed by a lowercase name.

A duplicate name raises; an unknown name raises with the sorted choices (it is a user error,
so the CLI prints it without a traceback). Adding a domain, verifier, advantage estimator or
loss is a new function or class plus one ``@REGISTRY.register("name")`` line. A throwaway entry
(a test's) is registered for one block only: ``with DOMAINS.temporary("name", entry): ...``.
A family of entries made on demand (one per dataset of an optional library) is a resolver for a
name prefix: ``DOMAINS.lazy("rg.", make, "rg.<dataset>")`` makes ``rg.x`` on its first ``get`` and
keeps it for later ones; ``names()`` and ``in`` report the registered entries only, so what they list
does not depend on which names were asked for before.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Generic, Iterator, TypeVar

from rlvr.errors import UserError

T = TypeVar("T")


class Registry(Generic[T]):
    """A name -> entry map that refuses duplicates and explains misses."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._resolved: dict[str, T] = {}  # entries made on demand by a resolver (not listed)
        self._resolvers: list[tuple[str, Callable[[str], T], str]] = []

    def register(self, name: str) -> Callable[[T], T]:
        if name != name.lower():
            raise ValueError(f"{self.kind} names are lowercase: {name!r}")

        def decorator(entry: T) -> T:
            if name in self._entries and self._entries[name] is not entry:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = entry
            return entry

        return decorator

    @contextmanager
    def temporary(self, name: str, entry: T) -> Iterator[T]:
        """Register ``entry`` as ``name`` for the ``with`` block only, and remove it again however
        the block ends (an exception too). Refuses a name that is already registered (even to the
        same entry), so a throwaway entry can never replace, or on exit remove, a real one."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self.register(name)(entry)
        try:
            yield entry
        finally:
            if self._entries.get(name) is entry:
                del self._entries[name]

    def lazy(self, prefix: str, resolve: Callable[[str], T], hint: str) -> None:
        """Make unregistered names starting with ``prefix`` on demand: ``get(name)`` calls
        ``resolve(name)`` (which raises ``UserError`` for a name it cannot make, e.g. an optional
        dependency missing), keeps the entry for later calls (unlisted) and returns it. ``hint`` names the
        family in the unknown-name message (``"rg.<dataset>"``)."""
        if prefix != prefix.lower():
            raise ValueError(f"{self.kind} names are lowercase: {prefix!r}")
        if any(p == prefix for p, _, _ in self._resolvers):
            raise ValueError(f"{self.kind} prefix {prefix!r} already has a resolver")
        self._resolvers.append((prefix, resolve, hint))

    def get(self, name: str) -> T:
        if name in self._entries:
            return self._entries[name]
        if name in self._resolved:
            return self._resolved[name]
        for prefix, resolve, _ in self._resolvers:
            if name.startswith(prefix):
                return self._resolved.setdefault(name, resolve(name))
        choices = [*self.names(), *self.lazy_hints()]
        raise UserError(f"unknown {self.kind} {name!r}; choose one of: {', '.join(choices)}")

    def lazy_hints(self) -> list[str]:
        """The families made on demand (``lazy``), as their hints."""
        return [hint for _, _, hint in self._resolvers]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)
