"""A Griffe extension for the API reference: the docstrings' reST roles as cross-references.

The docstrings are written in Google style with reST inline markup (``:class:`Journal```,
``:meth:`~.Journal.persist```), which mkdocstrings shows as raw text. Once a package is loaded,
each role becomes an optional autoref: a link when the target is rendered in the guide, plain
code otherwise (never a broken link). ``~`` shows the last name only, as in Sphinx.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|exc|obj|const|type):`(?P<target>[^`]+)`")


class SphinxRoles(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for obj in _objects(pkg):
            if obj.docstring is not None and ":" in obj.docstring.value:
                obj.docstring.value = ROLE.sub(lambda m, o=obj: _autoref(o, m["target"]), obj.docstring.value)


def _objects(obj: griffe.Object) -> list[griffe.Object]:
    out = [obj]
    for member in obj.members.values():
        if not member.is_alias:
            out.extend(_objects(member))  # type: ignore[arg-type]
    return out


def _autoref(obj: griffe.Object, target: str) -> str:
    title, short = target.strip(), target.startswith("~")
    name = title.lstrip("~")
    shown = name.rsplit(".", 1)[-1] if short else name.lstrip(".")
    return f'<autoref identifier="{_resolve(obj, name)}" optional><code>{shown}</code></autoref>'


def _resolve(obj: griffe.Object, name: str) -> str:
    """The full path of ``name`` as seen from ``obj`` (a leading dot: relative to its package)."""
    if name.startswith("."):
        module = obj.module
        base = module.path if module.is_package else module.parent.path if module.parent else module.path
        dots = len(name) - len(name.lstrip("."))
        for _ in range(dots - 1):
            base = base.rsplit(".", 1)[0]
        return f"{base}.{name.lstrip('.')}"
    head, _, rest = name.partition(".")
    if rest and head == obj.package.name:  # already absolute (journal.errors.X)
        return name
    for scope in (obj, obj.parent):
        if scope is None:
            continue
        try:
            return scope.resolve(head) + (f".{rest}" if rest else "")
        except Exception:  # not a name in that scope
            continue
    return name
