"""Public callables document their parameters (in the style of python-control's docstrings_test).

For every name in a module's ``__all__`` that is a function or a class defined there, each
parameter of its signature (a class: its ``__init__``; a dataclass: its fields) must appear in a
numpydoc ``Parameters`` section of its docstring (``name : type`` lines; ``a, b : type`` documents
both). ``self``, ``*args`` and ``**kwargs`` are exempt.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import re

import pytest

PACKAGES = ("tokenfactory", "tokenfactory.controllers", "tokenfactory.plant_models", "tokenfactory.traces",
            "tokenfactory.studies")
#: modules whose public names are entry points with their own help text, not library API
EXEMPT_MODULES = {"tokenfactory.cli"}  # and its submodules (the commands)


def _modules() -> list[str]:
    names = set()
    for pkg in PACKAGES:
        p = importlib.import_module(pkg)
        names.add(pkg)
        for m in pkgutil.walk_packages(p.__path__, pkg + "."):
            names.add(m.name)
    return sorted(n for n in names if n not in EXEMPT_MODULES
                  and not n.startswith(("tokenfactory.studies.", "tokenfactory.cli.")))


def _public_callables():
    out = []
    for name in _modules():
        mod = importlib.import_module(name)
        for obj_name in getattr(mod, "__all__", []):
            obj = getattr(mod, obj_name, None)
            if getattr(obj, "__module__", None) == name and (inspect.isfunction(obj) or inspect.isclass(obj)):
                out.append((f"{name}.{obj_name}", obj))
    return out


def _documented(doc: str) -> set[str]:
    """Parameter names listed in the docstring's Parameters section(s)."""
    names: set[str] = set()
    for section in re.split(r"\n(?=\S.*\n-{3,})", doc):
        head = section.lstrip().split("\n", 1)[0].strip()
        if head not in ("Parameters", "Other Parameters", "Attributes"):
            continue
        for line in section.splitlines()[2:]:
            m = re.match(r"^([\w*][\w*, ]*?)\s*:", line)
            if m and not line.startswith(" "):
                names.update(n.strip().lstrip("*") for n in m.group(1).split(","))
    return names


def _parameters(obj) -> list[str]:
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
        return [f.name for f in dataclasses.fields(obj) if f.init and not f.name.startswith("_")]
    target = obj.__init__ if inspect.isclass(obj) else obj
    if target is object.__init__:
        return []
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    return [p.name for p in sig.parameters.values()
            if p.name not in ("self", "cls") and not p.name.startswith("_")
            and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]


CALLABLES = _public_callables()


def _missing(obj) -> list[str]:
    """Parameters of ``obj`` without a numpydoc entry (class docstring and ``__init__``'s together)."""
    params = _parameters(obj)
    if not params:
        return []
    doc = inspect.getdoc(obj) or ""
    if inspect.isclass(obj) and obj.__init__ is not object.__init__:
        doc += "\n" + (inspect.getdoc(obj.__init__) or "")
    documented = _documented(doc)
    return [p for p in params if p not in documented]


@pytest.mark.parametrize("name,obj", CALLABLES, ids=[c[0] for c in CALLABLES])
def test_parameters_are_documented(name, obj):
    missing = _missing(obj)
    assert not missing, f"{name}: parameters without a numpydoc entry: {', '.join(missing)}"


def test_the_check_sees_a_missing_parameter():
    def f(a, b, *args, c=1, **kw):
        """Do it.

        Parameters
        ----------
        a, b : int
            Numbers.
        """

    assert _documented(inspect.getdoc(f)) == {"a", "b"}
    assert _parameters(f) == ["a", "b", "c"]
