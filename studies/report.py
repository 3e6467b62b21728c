"""Writing a study's outputs: figures (PNG), ``metrics.json`` (with the resolved config, the
provenance and an index of the artefacts), CSVs and ``summary.md`` under one folder; the HTML
report (:mod:`tokenfactory.studies.html`) is built from these."""

from __future__ import annotations

import json
import math
import platform
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["StudyReport", "to_jsonable", "provenance", "markdown_table", "human", "vllm_batch_flag",
           "table_problems"]


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


def human(v: Any, digits: int = 3) -> str:
    """A value as a person reads it: no exponent notation, no long decimals, no printed dicts.

    ``True``/``False`` -> ``yes``/``no``; None or non-finite -> ``-``; integers and floats of 1,000
    or more with thousands separators and no decimals (``8,390,642``); from 100 to 1,000 no
    decimals; smaller values to ``digits`` significant digits (``0.000643``); a nonzero value under
    0.0001 in size prints as ``< 0.0001`` (``> -0.0001``); a dict as ``key value, key value``; a
    list comma-joined.

    Parameters
    ----------
    v : any
        The value.
    digits : int
        Significant digits below 100 (default 3).

    Returns
    -------
    str
        The text.
    """
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if v is None:
        return "-"
    if isinstance(v, (int, np.integer)):
        return f"{int(v):,}"
    if isinstance(v, (float, np.floating)):
        f = float(v)
        if not math.isfinite(f):
            return "-"
        a = abs(f)
        if a >= 100:
            return f"{f:,.0f}"
        if a == 0:
            return "0"
        if a < 1e-4:   # numerically nothing next to the figures a report compares (3.24e-60)
            return "< 0.0001" if f > 0 else "> -0.0001"
        text = f"{f:.{digits}g}"
        if "e" in text:  # .3g of 0.000643 is 0.000643, but .2g of it is 6.4e-04: spell it out
            text = f"{f:.{digits + 3}f}".rstrip("0").rstrip(".")
        return text
    if isinstance(v, dict):
        return ", ".join(f"{k} {human(x, digits)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return ", ".join(human(x, digits) for x in v)
    return str(v)


def vllm_batch_flag(batch_cap: float) -> str:
    """The decode batch cap per worker as vLLM's flag.

    Parameters
    ----------
    batch_cap : float
        Sequences per decode worker (the largest batch meeting the TPOT target).

    Returns
    -------
    str
        ``--max-num-seqs N``, N rounded down (at least 1).
    """
    return f"--max-num-seqs {max(int(math.floor(batch_cap)), 1)}"


def markdown_table(rows: list[dict], cols: list[str]) -> list[str]:
    """Markdown lines of a table of ``rows`` (dicts) in the columns ``cols``.

    Values print through :func:`human` (a missing, None or non-finite value prints as ``-``,
    never ``nan``); the header spaces out the snake-case keys. A blank line ends the table, so a
    line that follows it is never read as a row.

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
    out = ["| " + " | ".join(c.replace("_", " ") for c in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(human(r.get(c)).replace("|", "/") for c in cols) + " |")
    return out + [""]


def _cells(line: str) -> list[str]:
    body = line.strip()
    body = body[1:] if body.startswith("|") else body
    body = body[:-1] if body.endswith("|") else body
    return re.split(r"(?<!\\)\|", body)


def table_problems(text: str) -> list[str]:
    """What would render wrongly in the tables of a summary's Markdown: empty means none.

    The text is rendered as the HTML report renders it (python-markdown's ``tables`` extension)
    and each source table is compared with its rendering: the same number of header columns, of
    rows, and every source row with the header's number of cells; a non-blank line right after
    a table is reported (it renders as one more row - the bullet-under-a-table mistake).

    Parameters
    ----------
    text : str
        The Markdown (a ``summary.md``).

    Returns
    -------
    list of str
        One sentence per problem, naming the line.
    """
    import markdown

    lines = text.splitlines()
    blocks, problems = [], []
    i = 0
    while i < len(lines):
        if (lines[i].lstrip().startswith("|") and i + 1 < len(lines)
                and re.match(r"^\s*\|?\s*:?-{3,}", lines[i + 1])):
            cols = len(_cells(lines[i]))
            j = i + 2
            while j < len(lines) and lines[j].strip().startswith("|"):
                if len(_cells(lines[j])) != cols:
                    problems.append(f"line {j + 1}: {len(_cells(lines[j]))} cells under a {cols}-column header")
                j += 1
            if j < len(lines) and lines[j].strip():
                problems.append(f"line {j + 1}: {lines[j].strip()[:50]!r} follows the table of line {i + 1} without "
                                "a blank line, so it renders as a table row")
                while j < len(lines) and lines[j].strip():  # the renderer swallows these lines too
                    j += 1
            blocks.append((cols, j - i - 2, i + 1))
            i = j
        else:
            i += 1
    rendered = re.findall(r"<table>(.*?)</table>", markdown.markdown(text, extensions=["tables"]), re.S)
    if len(rendered) != len(blocks):
        problems.append(f"{len(blocks)} tables in the source, {len(rendered)} rendered")
        return problems
    for (cols, nrows, line), html_table in zip(blocks, rendered):
        head, _, body = html_table.partition("</thead>")
        if len(re.findall(r"<th\b", head)) != cols:
            problems.append(f"line {line}: {cols} columns in the source, {len(re.findall(r'<th', head))} rendered")
        got = len(re.findall(r"<tr\b", body))
        if got != nrows and not any(p.startswith(f"line ") and f"table of line {line}" in p for p in problems):
            problems.append(f"line {line}: {nrows} rows in the source, {got} rendered")
    return problems


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
    loops : list of dict
        Oscillation verdicts and margins of the study's feedback loops, added by :meth:`loop`; the
        HTML report opens with them.
    answers : list of dict
        ``kind`` (``"capacity"`` or ``"change"``) and ``text`` added by :meth:`answer`; the HTML
        report's opening answers.
    """

    name: str
    out_dir: Path
    config: dict[str, Any]
    figures: list[tuple[str, str]] = field(default_factory=list)
    tables: list[tuple[str, str]] = field(default_factory=list)
    headlines: list[dict[str, Any]] = field(default_factory=list)
    loops: list[dict[str, Any]] = field(default_factory=list)
    answers: list[dict[str, Any]] = field(default_factory=list)
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

    def loop(self, name: str, oscillates: bool | None, *, gain_margin: float | None = None,
             phase_margin_deg: float | None = None, delay_margin_s: float | None = None, detail: str = "") -> None:
        """A feedback loop's verdict for the report's opening answers: does it oscillate, and its margins.

        Parameters
        ----------
        name : str
            The loop in the domain's words ("admission, smoothed (SIMC-tuned)").
        oscillates : bool or None
            The run's verdict (detectors on the simulated signal, or a predicted limit cycle);
            None when the study did not simulate it.
        gain_margin, phase_margin_deg, delay_margin_s : float, optional
            Its margins (the worst over the study's envelope where it has one).
        detail : str
            One sentence from the run's numbers (period, where the worst point is).
        """
        self.loops.append({"loop": name, "oscillates": None if oscillates is None else bool(oscillates),
                           "gain_margin": gain_margin, "phase_margin_deg": phase_margin_deg,
                           "delay_margin_s": delay_margin_s, "detail": detail})

    def answer(self, kind: str, text: str) -> None:
        """An answer for the report's opening.

        Parameters
        ----------
        kind : str
            ``"capacity"`` (what limits capacity) or ``"change"`` (what to change).
        text : str
            One sentence generated from the run's numbers.
        """
        if kind not in ("capacity", "change"):
            raise ValueError(f"answer kind {kind!r} is not 'capacity' or 'change'")
        self.answers.append({"kind": kind, "text": text})

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
                           "headlines": self.headlines, "loops": self.loops, "answers": self.answers}}
        (self.out_dir / "metrics.json").write_text(json.dumps(to_jsonable(full), indent=2) + "\n")
        lines = [f"# {self.name}", "", *summary_lines, "", "## Figures", ""]
        for filename, caption in self.figures:
            lines += [f"![{filename}]({filename})", "", f"*{filename}*: {caption}", ""]
        text = "\n".join(lines)
        (self.out_dir / "summary.md").write_text(text)
        bad = table_problems(text)
        if bad:  # a summary whose tables do not render is a bug of the study, caught by its own test
            raise ValueError(f"{self.name}: summary.md tables would not render with their columns: " + "; ".join(bad))
        return full
