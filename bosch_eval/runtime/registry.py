"""One registry helper for every family of interchangeable parts (rankers, layer heuristics,
SWA kernels, optimizers, KV-quantization methods, search variants, pattern importers).

Each member declares its own name once, where it is defined (``@RANKERS.register("mine")``
on a class in a new file ``search/rankers/mine.py``), and its command-line flags, if it has
any, as :class:`Flag` values beside it. A registry with a ``package`` imports every module of
that package the first time a name is missing or the names are listed, so a new file in the
package is all a new member takes (docs/extending.md). Known names import nothing.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

from bosch_eval.runtime.errors import SettingsError

T = TypeVar("T")
# Names travel through lm-eval's model_args ("a=1,b=2") and command lines.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")


class Registry(Generic[T]):
    """Members of one family by name, in registration order.

    Args:
        family: what a member is, for messages ("ranker", "layer heuristic").
        package: a package whose modules define members; imported on demand, in name order.
        first: modules of ``package`` imported before the others, in this order, where the
            members' order decides something (``auto``'s preference among optimizers, the
            order incumbents are scored in): the built-in members keep their order, and a new
            module needs no entry here. They are imported before any member registers, so a
            module imported on its own (``from ...optimizers import oneplusone``) cannot go first,
            and :meth:`names` lists their members first, in this order, whatever was imported when.
        field: the setting the name comes from, for messages (default: ``family``).
        error: what an unknown name raises (a ``BoschError`` subclass, so commands print it).

    Attributes:
        members: ``{name: member}`` registered so far (tests patch it with ``monkeypatch``);
            :meth:`names` and lookups see every member.
    """

    def __init__(
        self,
        family: str,
        *,
        package: str | None = None,
        first: tuple[str, ...] = (),
        field: str | None = None,
        error: type[Exception] = SettingsError,
    ) -> None:
        self.family, self.package, self.first, self.field, self.error = family, package, first, field or family, error
        self.members: dict[str, T] = {}
        self._origin: dict[str, str] = {}  # name -> the module that registered it
        self._first_imported = False

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...
    @overload
    def register(self, name: str, member: T) -> T: ...
    def register(self, name: str, member: T | None = None) -> T | Callable[[T], T]:
        """Add ``member`` under ``name``; without ``member``, a decorator that adds what it decorates.

        Raises:
            ValueError: a malformed name, or one that is taken (two members cannot share it).
        """
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"{self.family} name: expected letters, digits, '_', '-' or '.', got {name!r}")
        origin = sys._getframe(1).f_globals.get("__name__", "")  # the registering module, for names()' order
        if member is None:
            return lambda decorated: self._add(name, decorated, origin)
        return self._add(name, member, origin)

    def _add(self, name: str, member: T, origin: str) -> T:
        if name in self.members:
            raise ValueError(f"{self.family} {name!r} is registered twice: {self.members[name]!r} and {member!r}")
        self._import_first()
        self.members[name] = member
        self._origin[name] = origin
        return member

    def lookup(self, name: str, field: str | None = None) -> T:
        """The member called ``name``; else ``error`` naming ``field``, the name, the valid names
        and the closest one."""
        if name not in self:
            valid = sorted(self.names())
            close = difflib.get_close_matches(str(name), valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise self.error(f"{field or self.field}: unknown {self.family} {name!r}, expected one of {valid}{hint}")
        return self.members[name]

    __getitem__ = lookup

    def names(self) -> tuple[str, ...]:
        """Every member's name: those of the ``first`` modules in their order, then the others in
        registration order (a package's modules are imported first)."""
        self._discover()
        firsts = {f"{self.package}.{module}": rank for rank, module in enumerate(self.first)}
        order = {
            name: (firsts.get(self._origin.get(name, ""), len(firsts)), index)
            for index, name in enumerate(self.members)
        }
        return tuple(sorted(self.members, key=order.__getitem__))

    def items(self) -> list[tuple[str, T]]:
        """``(name, member)`` of every member, in registration order."""
        return [(name, self.members[name]) for name in self.names()]

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str) and name not in self.members:
            self._discover()
        return isinstance(name, str) and name in self.members

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def _discover(self) -> None:
        """Import every module of ``package``: each registers its members as it is imported."""
        if self.package is None:
            return
        self._import_first()
        package = importlib.import_module(self.package)
        for module in pkgutil.iter_modules(package.__path__, f"{self.package}."):
            importlib.import_module(module.name)

    def _import_first(self) -> None:
        """Import the ``first`` modules, once; the one being imported, if any, continues after."""
        if self._first_imported or self.package is None:
            return
        self._first_imported = True
        for name in self.first:
            importlib.import_module(f"{self.package}.{name}")


@dataclass(frozen=True)
class Flag:
    """A command-line flag a member declares for one of its options, beside the member itself
    (``Ranker.flags``), so the command needs no list of every member's flags.

    Attributes:
        flag: the flag as typed, prefixed with the member's name (``--proxy-block``).
        option: the keyword the member takes its value as (``block``).
        type: turns the flag's text into the value (``int``, ``float``).
        help: what the option sets, and its default.
        nargs: ``"+"`` for a list of values; None for one.
    """

    flag: str
    option: str
    type: Callable[[str], Any] = str
    help: str = ""
    nargs: str | None = None

    def add_to(self, parser: Any) -> None:
        """Declare the flag on ``parser`` (an ``argparse`` parser or argument group); its value
        lands on ``option``, None when the flag is not given."""
        parser.add_argument(self.flag, dest=self.option, type=self.type, nargs=self.nargs, help=self.help)
