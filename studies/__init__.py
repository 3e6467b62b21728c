"""Runnable studies. Each module has ``run(out_dir, quick=False) -> dict`` writing figures,
``metrics.json`` and ``summary.md``; ``tokenfactory study NAME`` runs one, ``study all`` the suite."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from tokenfactory.validation import ConfigError

__all__ = ["STUDIES", "run_study"]

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
}


def run_study(name: str, out_dir: str | Path | None = None, quick: bool = False) -> dict[str, Any]:
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
        suite runs). Default False: the full study.

    Returns
    -------
    dict
        The study's metrics as written to ``metrics.json`` (with its config and provenance).

    Raises
    ------
    ConfigError
        When ``name`` is not a known study.
    """
    if name not in STUDIES:
        raise ConfigError("study", f"unknown study {name!r}; studies are {', '.join(STUDIES)}")
    module = importlib.import_module(STUDIES[name])
    out = Path(out_dir) if out_dir is not None else Path("reports") / name
    return module.run(out, quick=quick)
