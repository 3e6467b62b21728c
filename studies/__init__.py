"""Runnable studies. Each module has ``run(out_dir, quick=False, config=None) -> dict`` writing
figures, ``metrics.json`` and ``summary.md``; studies whose grids have a heavier variant also take
``full=False``. ``tokenfactory study NAME`` runs one, ``study all`` the suite. Each declares its
settings as ``CONFIG`` (a :class:`~tokenfactory.studies.study_config.StudyVariants`) and resolves
them once with :func:`~tokenfactory.studies.study_config.resolve_study_config`.

Three sizes of every study:

* ``quick`` - the fewest points that still show the effect; what the default test suite runs;
* default - what ``make run`` runs: every figure of the report, sized so the whole suite finishes
  in a few minutes on two cores;
* ``full`` - the heavy grids (more models, longer runs, more seeds); studies without a heavier
  variant run their default.
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path
from typing import Any

from tokenfactory.core.validation import ConfigError

__all__ = ["STUDIES", "ON_DEMAND", "default_suite", "TYPICAL_SECONDS", "run_study", "has_full_variant", "suite_order"]

#: study name -> module; the default suite (`make run`) runs them in this order.
STUDIES: dict[str, str] = {
    "operating-modes": "tokenfactory.studies.operating_modes",
    "roofline-validation": "tokenfactory.studies.roofline_validation",
    "bandwidth-capacity": "tokenfactory.studies.bandwidth_capacity",
    "k3-projection": "tokenfactory.studies.k3_projection",
    "feedback-oscillation": "tokenfactory.studies.feedback_oscillation",
    "forecasting": "tokenfactory.studies.forecasting",
    "trace-replay": "tokenfactory.studies.trace_replay",
    "reconfiguration": "tokenfactory.studies.reconfiguration",
    "layered-stack": "tokenfactory.studies.layered_stack",
    "overload": "tokenfactory.studies.overload",
    "aggregation": "tokenfactory.studies.aggregation",
    "long-context": "tokenfactory.studies.long_context",
    "kv-tiers": "tokenfactory.studies.kv_tiers",
    "incidents": "tokenfactory.studies.incidents",
    "live": "tokenfactory.studies.live",
}

#: studies `study all` (and so `make run`) leaves out: they need services that only the project's
#: CI installs (a Debian Prometheus) and drive real servers for minutes of wall-clock time; run
#: them by name (`tokenfactory study live`)
ON_DEMAND: frozenset[str] = frozenset({"live"})


def default_suite() -> list[str]:
    """The studies `study all` runs: :data:`STUDIES` in order, without :data:`ON_DEMAND`.

    Returns
    -------
    list of str
    """
    return [n for n in STUDIES if n not in ON_DEMAND]


def has_full_variant(name: str) -> bool:
    """Whether study ``name`` has a heavier ``full`` variant (its ``run`` takes ``full``).

    Parameters
    ----------
    name : str
        A key of :data:`STUDIES`.

    Returns
    -------
    bool
        True when ``run_study(name, full=True)`` runs more than the default.
    """
    module = importlib.import_module(STUDIES[name])
    return "full" in inspect.signature(module.run).parameters


def run_study(name: str, out_dir: str | Path | None = None, quick: bool = False,
              full: bool = False, sweep=None) -> dict[str, Any]:
    """Run study ``name``, writing under ``out_dir`` (default ``reports/<name>``).

    Parameters
    ----------
    name : str
        A key of :data:`STUDIES` (``"operating-modes"``, ``"feedback-oscillation"``, ...).
    out_dir : str or Path, optional
        Folder for the study's figures, CSVs, ``metrics.json`` and ``summary.md``; created if
        missing. Default ``reports/<name>`` relative to the working directory.
    quick : bool
        Run the study's quick variant (shorter runs, fewer points or models; what the default test
        suite runs). Default False.
    full : bool
        Run the study's heavy grids (``tokenfactory study NAME --full``); a study without a
        heavier variant runs its default. Default False: the default variant (``make run``).
    sweep : tokenfactory.sweep.SweepBackend, optional
        Where the study's grids run (serially, or on Dask), for studies whose ``run`` takes
        ``sweep``; None: serial unless the user's environment names a Dask cluster.

    Returns
    -------
    dict
        The study's metrics as written to ``metrics.json`` (with its config and provenance).

    Raises
    ------
    ConfigError
        When ``name`` is not a known study, or ``quick`` and ``full`` are both set.
    """
    if name not in STUDIES:
        raise ConfigError("study", f"unknown study {name!r}; studies are {', '.join(STUDIES)}")
    if quick and full:
        raise ConfigError("study", "quick and full are exclusive: pick one variant")
    module = importlib.import_module(STUDIES[name])
    out = Path(out_dir) if out_dir is not None else Path("reports") / name
    kw = {"sweep": sweep} if sweep is not None and "sweep" in inspect.signature(module.run).parameters else {}
    if full and has_full_variant(name):
        return module.run(out, quick=False, full=True, **kw)
    return module.run(out, quick=quick, **kw)


#: Wall seconds of each study's default variant in ``tokenfactory study all --jobs 2`` on the
#: 2-core development machine (2026-11-30, ``make run``: the whole suite in 3 min 31 s): the order
#: of a first run, before any report exists.
TYPICAL_SECONDS: dict[str, float] = {
    "reconfiguration": 138.1, "overload": 63.5, "layered-stack": 47.1, "trace-replay": 40.2,
    "forecasting": 33.2, "kv-tiers": 21.4, "aggregation": 19.7, "feedback-oscillation": 17.1,
    "long-context": 13.5, "operating-modes": 5.3, "k3-projection": 4.5, "roofline-validation": 2.7,
    "bandwidth-capacity": 2.4, "incidents": 20.0,
    # live: not yet measured in a `make run`; its quick variant took 383-510 s on the shared machine
    # under a load average of 15-20 (2026-12-01), the default runs four 60 s loads and a 85 s sweep
    "live": 600.0,
}


def suite_order(names: list[str], reports_dir: str | Path) -> list[str]:
    """``names`` longest first by the wall time of their last report under ``reports_dir``.

    Running the longest studies first keeps parallel workers busy to the end (LPT scheduling). A
    study without a report is placed by :data:`TYPICAL_SECONDS`; one in neither keeps its place
    after the timed ones, in :data:`STUDIES` order.

    Parameters
    ----------
    names : list of str
        Study names (keys of :data:`STUDIES`).
    reports_dir : str or Path
        Folder holding ``<name>/metrics.json`` from a previous run (may be missing).

    Returns
    -------
    list of str
        The same names, reordered.
    """
    seconds: dict[str, float] = {}
    for n in names:
        try:
            m = json.loads((Path(reports_dir) / n / "metrics.json").read_text())
            seconds[n] = float(m["provenance"]["wall_seconds"])
        except (OSError, ValueError, KeyError, TypeError):
            if n in TYPICAL_SECONDS:
                seconds[n] = TYPICAL_SECONDS[n]
    timed = sorted((n for n in names if n in seconds), key=lambda n: -seconds[n])
    return timed + [n for n in names if n not in seconds]
