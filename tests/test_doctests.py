"""Docstring examples run: every ``>>>`` example in the package is a doctest, and it passes.

An example that drifts from the code (a kind renamed, a key its loader rejects) fails here.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

PACKAGES = ("tokenfactory", "tokenfactory.controllers", "tokenfactory.plant_models", "tokenfactory.traces",
            "tokenfactory.studies")


def _modules() -> list[str]:
    names = set()
    for pkg in PACKAGES:
        names.add(pkg)
        for m in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + "."):
            names.add(m.name)
    return sorted(names)


def _examples(name: str) -> list[doctest.DocTest]:
    return [t for t in doctest.DocTestFinder(exclude_empty=True).find(importlib.import_module(name)) if t.examples]


WITH_EXAMPLES = [n for n in _modules() if _examples(n)]


def test_the_stack_scenario_example_is_collected():
    # the stack package's docstring shows the scenario layout as a doctest
    assert "tokenfactory.stack" in WITH_EXAMPLES


@pytest.mark.parametrize("name", WITH_EXAMPLES)
def test_docstring_examples_pass(name):
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in _examples(name):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} docstring examples fail"
