"""Writing a study's outputs: figures (PNG), ``metrics.json`` (with the resolved config), CSVs
and ``summary.md`` under one folder."""

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

__all__ = ["StudyReport", "to_jsonable"]


def to_jsonable(obj: Any) -> Any:
    """Convert numpy/pandas scalars and containers to plain JSON; non-finite floats become None."""
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


@dataclass
class StudyReport:
    """Collects one study's artefacts and writes them into ``out_dir``."""

    name: str
    out_dir: Path
    config: dict[str, Any]
    figures: list[tuple[str, str]] = field(default_factory=list)
    _t0: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)

    def save_figure(self, fig, filename: str, caption: str) -> Path:
        path = self.out_dir / filename
        fig.savefig(path, dpi=120)
        self.figures.append((filename, caption))
        return path

    def save_table(self, df: pd.DataFrame, filename: str) -> Path:
        path = self.out_dir / filename
        df.to_csv(path, index=False)
        return path

    def finish(self, metrics: dict[str, Any], summary_lines: list[str]) -> dict[str, Any]:
        """Write ``metrics.json`` (metrics + config + provenance) and ``summary.md``."""
        from tokenfactory import __version__

        full = {**metrics, "study": self.name, "config": self.config,
                "provenance": {"tokenfactory": __version__, "python": platform.python_version(),
                               "wall_seconds": time.perf_counter() - self._t0}}
        (self.out_dir / "metrics.json").write_text(json.dumps(to_jsonable(full), indent=2) + "\n")
        lines = [f"# {self.name}", "", *summary_lines, "", "## Figures", ""]
        for filename, caption in self.figures:
            lines += [f"![{filename}]({filename})", "", f"*{filename}*: {caption}", ""]
        (self.out_dir / "summary.md").write_text("\n".join(lines))
        return full
