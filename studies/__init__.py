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
    "feedback-oscillation": "tokenfactory.studies.feedback_oscillation",
    "forecasting": "tokenfactory.studies.forecasting",
    "trace-replay": "tokenfactory.studies.trace_replay",
    "reconfiguration": "tokenfactory.studies.reconfiguration",
}


def run_study(name: str, out_dir: str | Path | None = None, quick: bool = False) -> dict[str, Any]:
    """Run study ``name``, writing under ``out_dir`` (default ``reports/<name>``)."""
    if name not in STUDIES:
        raise ConfigError("study", f"unknown study {name!r}; studies are {', '.join(STUDIES)}")
    module = importlib.import_module(STUDIES[name])
    out = Path(out_dir) if out_dir is not None else Path("reports") / name
    return module.run(out, quick=quick)
