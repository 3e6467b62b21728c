"""The layering: no import runs upward, no study imports another study, one import name.

Every module of the installed package is parsed (imports inside functions included) and each
``tokenfactory.*`` import is checked against the layer table below, the one docs/architecture.md
draws. A module may import its own layer and the layers below it.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

#: (layer, modules or packages), bottom first; the longest matching entry wins. Every entry names a
#: module or package that exists (test_every_listed_module_exists), every module is in a layer.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ("tokenfactory.core",)),
    ("service", ("tokenfactory.plant_models.hardware", "tokenfactory.plant_models.moe_model",
                 "tokenfactory.plant_models.roofline", "tokenfactory.plant_models.stage_memory",
                 "tokenfactory.plant_models.service", "tokenfactory.plant_models.published_points",
                 "tokenfactory.plant_models.calibrated")),
    ("plants and traces", ("tokenfactory.plant_models", "tokenfactory.traces")),
    ("controllers and analysis", ("tokenfactory.controllers",)),
    ("registry", ("tokenfactory.registry", "tokenfactory.scenario", "tokenfactory.replay",
                  "tokenfactory.replay_scenario", "tokenfactory.replay_costs", "tokenfactory.stack",
                  "tokenfactory.advise", "tokenfactory.reproduction",
                  "tokenfactory.testing", "tokenfactory.sweep")),
    ("live", ("tokenfactory.live",)),
    ("studies", ("tokenfactory.studies",)),
    ("cli", ("tokenfactory.cli", "tokenfactory.reference")),
]
ROOT_PACKAGE = "tokenfactory"  # its __init__ is part of the core: it may import only core modules


def _layer_of(module: str) -> int:
    if module == ROOT_PACKAGE:
        return 0
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    if best is None:
        raise AssertionError(f"module {module} is in no layer; add it to tests/test_layers.py LAYERS and "
                             "docs/architecture.md")
    return best


def _package_modules() -> dict[str, Path]:
    """Every module of the installed package, found through the import system (so the
    package-dir mapping is what is checked, not the folder names)."""
    mods: dict[str, Path] = {}
    for pkg in ("tokenfactory", "tokenfactory.controllers", "tokenfactory.plant_models", "tokenfactory.traces",
                "tokenfactory.studies"):
        spec = importlib.util.find_spec(pkg)
        assert spec is not None and spec.submodule_search_locations, pkg
        folder = Path(list(spec.submodule_search_locations)[0])
        for f in sorted(folder.rglob("*.py")):
            rel = f.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([pkg, *parts])
            mods[name] = f
    return mods


def _imported_from(node: ast.ImportFrom, module: str, is_pkg: bool) -> str:
    """The module a ``from ... import`` reads, a relative import resolved against ``module``'s package."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_pkg else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(path: Path, module: str) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            name = _imported_from(node, module, is_pkg)
            out.append((node.lineno, name))
            # `from tokenfactory import studies`-style imports name submodules
            for a in node.names:
                if f"{name}.{a.name}" in MODULES:
                    out.append((node.lineno, f"{name}.{a.name}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in MODULES:
            # a module named in a string (importlib.import_module, find_spec, resources.files) is an import
            out.append((node.lineno, node.value))
    return out


MODULES = _package_modules()


def test_every_listed_module_exists():
    # a stale entry (a module moved or removed) would silently place nothing
    listed = [p for _, prefixes in LAYERS for p in prefixes]
    missing = [p for p in listed if p not in MODULES]
    assert not missing, f"tests/test_layers.py LAYERS lists modules that do not exist: {missing}"


def test_no_module_name_occurs_twice():
    # one name, one idea: outside the studies (named after themselves) no two modules share a last name
    seen: dict[str, str] = {}
    twice = []
    for name in MODULES:
        if name.startswith("tokenfactory.studies.") or MODULES[name].name == "__init__.py":
            continue
        last = name.rsplit(".", 1)[-1]
        if last in seen:
            twice.append(f"{seen[last]} and {name}")
        seen[last] = name
    assert not twice, "module names occurring twice: " + "; ".join(twice)


def test_every_module_is_in_a_layer():
    for name in MODULES:
        _layer_of(name)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_upward_imports(module):
    here = _layer_of(module)
    bad = []
    for line, imported in _imports(MODULES[module], module):
        top = imported.split(".")[0]
        assert top not in ("controllers", "plant_models", "traces", "studies"), (
            f"{module}:{line} imports {imported!r}: use the one import name, tokenfactory.{imported}")
        if top != ROOT_PACKAGE:
            continue
        there = _layer_of(imported)
        if there > here:
            bad.append(f"{module}:{line} ({LAYERS[here][0]}) imports {imported} ({LAYERS[there][0]})")
    assert not bad, "upward imports:\n" + "\n".join(bad)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("tokenfactory.studies.")))
def test_no_study_imports_another_study(module):
    # the study registry, the report writer, the HTML page over all reports and the config resolver
    shared = {"tokenfactory.studies", "tokenfactory.studies.report", "tokenfactory.studies.html",
              "tokenfactory.studies.study_config"}
    # a study cut into a package (tokenfactory.studies.NAME.*) may import its own modules
    parts = module.split(".")
    own = ".".join(parts[:3]) if len(parts) > 3 or MODULES[module].name == "__init__.py" else module
    for line, imported in _imports(MODULES[module], module):
        if imported == own or imported.startswith(own + "."):
            continue
        if imported.startswith("tokenfactory.studies") and imported not in shared and imported != module:
            raise AssertionError(f"{module}:{line} imports the study {imported}; move what they share below "
                                 "the studies layer")


def test_the_layer_check_catches_an_upward_import(tmp_path):
    # the checker itself: a core module importing a controller is reported
    f = tmp_path / "signals.py"
    f.write_text("from tokenfactory.controllers import SmoothedAdmission\n")
    imported = _imports(f, "tokenfactory.core.signals")
    assert [(_layer_of(m) > _layer_of("tokenfactory.core.signals")) for _, m in imported] == [True]


def test_the_layer_check_sees_a_module_named_in_a_string(tmp_path):
    # find_spec / import_module / resources.files by name are imports too
    f = tmp_path / "registry.py"
    f.write_text("import importlib.util\nspec = importlib.util.find_spec('tokenfactory.studies')\n")
    imported = [m for _, m in _imports(f, "tokenfactory.registry")]
    assert "tokenfactory.studies" in imported
    assert _layer_of("tokenfactory.studies") > _layer_of("tokenfactory.registry")


def test_the_mapped_folders_are_subpackages():
    # the four top-level folders install under the one import name, and the bare names do not exist
    for pkg in ("controllers", "plant_models", "traces", "studies"):
        assert importlib.util.find_spec(f"tokenfactory.{pkg}") is not None
    assert len(MODULES) > 40


def _private_imports(path: Path, module: str) -> list[str]:
    """``from tokenfactory.x import _name`` where x is another module: a private name shared."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        name = _imported_from(node, module, is_pkg)
        if not name.startswith(ROOT_PACKAGE) or name == module:
            continue
        out += [f"{module}:{node.lineno} imports {a.name} from {name}" for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")]
    return out


def test_no_module_imports_another_modules_private_name():
    # issue 20: private names stay private; a name another module needs is public in its own
    bad = [row for name, path in MODULES.items() for row in _private_imports(path, name)]
    assert not bad, "cross-module private imports:\n" + "\n".join(bad)


def test_the_private_import_check_sees_one(tmp_path):
    f = tmp_path / "describing.py"
    f.write_text("from tokenfactory.controllers.stability import DelayedLoop, _grid\n")
    assert _private_imports(f, "tokenfactory.controllers.describing") == [
        "tokenfactory.controllers.describing:1 imports _grid from tokenfactory.controllers.stability"]


def test_pyproject_lists_every_package():
    # setuptools installs only the listed packages: a package missing there works in an editable
    # install and is absent from a wheel
    import tomllib

    listed = set(tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    packages = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    assert packages - listed == set(), f"pyproject.toml [tool.setuptools] packages lacks {sorted(packages - listed)}"
