"""Writing a study's outputs: figures (PNG), ``metrics.json`` (with the resolved config, the
provenance and an index of the artefacts), CSVs and ``summary.md`` under one folder; the HTML
report (:mod:`tokenfactory.studies.html`) is built from these."""

from __future__ import annotations

import json
import math
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["StudyReport", "to_jsonable", "provenance", "markdown_table"]


def _git_commit() -> str:
    """The source tree's commit (``+dirty`` with uncommitted changes), or ``unknown``."""
    import subprocess

    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def provenance() -> dict[str, Any]:
    """Where a result came from: commit, package versions, Python, platform.

    Returns
    -------
    dict
        ``commit``, ``tokenfactory``, ``python``, ``platform`` and the versions of the numerical
        dependencies.
    """
    from importlib import metadata

    from tokenfactory import __version__

    versions = {}
    for dist in ("numpy", "scipy", "pandas", "control", "simpy", "statsmodels", "matplotlib"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    return {"commit": _git_commit(), "tokenfactory": __version__, "python": platform.python_version(),
            "platform": platform.platform(), "versions": versions}


def to_jsonable(obj: Any) -> Any:
    """Convert numpy/pandas scalars and containers to plain JSON; non-finite floats become None.

    JSON has no NaN or infinity, so an unmeasured or unbounded figure is written as ``null``.

    Parameters
    ----------
    obj : any
        A value of a study's metrics: dicts (keys become strings), lists, tuples, numpy arrays,
        numpy scalars, bools, floats, paths; anything else is returned unchanged.

    Returns
    -------
    any
        The same structure built from dict, list, bool, int, float, str and None.
    """
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        f = float(obj)
        return f if math.isfinite(f) else None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def markdown_table(rows: list[dict], cols: list[str]) -> list[str]:
    """Markdown lines of a table of ``rows`` (dicts) in the columns ``cols``.

    Floats print with three significant digits; a missing, None or non-finite value prints as
    ``-`` (never ``nan``).

    Parameters
    ----------
    rows : list of dict
        One dict per row.
    cols : list of str
        The keys to show, in order (the header).

    Returns
    -------
    list of str
        The header, the separator and one line per row.
    """
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c)
            if v is None or (isinstance(v, float) and not math.isfinite(v)):
                cells.append("-")
            else:
                cells.append(f"{v:.3g}" if isinstance(v, float) else str(v))
        out.append("| " + " | ".join(cells) + " |")
    return out


@dataclass
class StudyReport:
    """Collects one study's artefacts and writes them into ``out_dir``.

    The folder is created on construction; :meth:`finish` writes ``metrics.json`` and
    ``summary.md`` and records the wall time since construction.

    Parameters
    ----------
    name : str
        The study's name (the title of ``summary.md`` and of its HTML section).
    out_dir : str or Path
        Folder the artefacts are written to.
    config : dict
        The study's resolved configuration (written into ``metrics.json``; seeds included).
    figures : list of (str, str)
        ``(file name, caption)`` of the figures saved so far (default empty).
    tables : list of (str, str)
        ``(file name, caption)`` of the CSV tables saved so far (default empty).
    headlines : list of dict
        Headline figures (``label``, ``value``, ``unit``, ``note``) added by :meth:`headline`.
    """

    name: str
    out_dir: Path
    config: dict[str, Any]
    figures: list[tuple[str, str]] = field(default_factory=list)
    tables: list[tuple[str, str]] = field(default_factory=list)
    headlines: list[dict[str, Any]] = field(default_factory=list)
    _t0: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)

    def save_figure(self, fig, filename: str, caption: str) -> Path:
        """Save ``fig`` as a PNG (120 dpi) in the folder and list it with ``caption``.

        Parameters
        ----------
        fig : matplotlib.figure.Figure
            The figure.
        filename : str
            File name inside ``out_dir`` (``"loop.png"``).
        caption : str
            What the figure shows; generated from the run's numbers where it states an outcome.

        Returns
        -------
        Path
            The written file.
        """
        path = self.out_dir / filename
        fig.savefig(path, dpi=120)
        self.figures.append((filename, caption))
        return path

    def save_table(self, df: pd.DataFrame, filename: str, caption: str = "") -> Path:
        """Write ``df`` as a CSV and list it (with ``caption``) in the report.

        Parameters
        ----------
        df : DataFrame
            The table (its index is not written).
        filename : str
            File name inside ``out_dir`` (``"margins.csv"``).
        caption : str
            What the table holds (default empty).

        Returns
        -------
        Path
            The written file.
        """
        path = self.out_dir / filename
        df.to_csv(path, index=False)
        self.tables.append((filename, caption))
        return path

    def headline(self, label: str, value: Any, unit: str = "", note: str = "") -> None:
        """A headline figure of the run, shown first in the HTML report.

        Parameters
        ----------
        label : str
            What it is ("naive loop period").
        value : number, bool or str
            The measured value (from this run).
        unit : str
            Its unit (``"s"``, ``"requests/s"``; default empty).
        note : str
            One line of context (what it is compared with; default empty).
        """
        self.headlines.append({"label": label, "value": value, "unit": unit, "note": note})

    def finish(self, metrics: dict[str, Any], summary_lines: list[str]) -> dict[str, Any]:
        """Write ``metrics.json`` (metrics + config + provenance + artefact index) and ``summary.md``.

        Parameters
        ----------
        metrics : dict
            The run's figures. The keys ``study``, ``config``, ``provenance`` and ``report``
            are reserved: this method sets them.
        summary_lines : list of str
            Markdown lines of the summary (outcome sentences generated from the run's numbers);
            the figure list with captions is appended.

        Returns
        -------
        dict
            What was written to ``metrics.json``, before JSON conversion (numpy values and
            non-finite floats are kept; the file has plain JSON with ``null`` for them).
        """
        full = {**metrics, "study": self.name, "config": self.config,
                "provenance": {**provenance(), "wall_seconds": time.perf_counter() - self._t0},
                "report": {"figures": [{"file": f, "caption": c} for f, c in self.figures],
                           "tables": [{"file": f, "caption": c} for f, c in self.tables],
                           "headlines": self.headlines}}
        (self.out_dir / "metrics.json").write_text(json.dumps(to_jsonable(full), indent=2) + "\n")
        lines = [f"# {self.name}", "", *summary_lines, "", "## Figures", ""]
        for filename, caption in self.figures:
            lines += [f"![{filename}]({filename})", "", f"*{filename}*: {caption}", ""]
        (self.out_dir / "summary.md").write_text("\n".join(lines))
        return full
