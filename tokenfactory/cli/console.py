"""What the commands share: a table printed for a person, a result written as JSON, a duration
read.
"""

from __future__ import annotations

import json

from tokenfactory.core.validation import ConfigError

__all__ = ["print_table", "write_json", "parse_duration"]


def print_table(d: dict) -> None:
    width = max(len(k) for k in d)
    for k, v in d.items():
        if isinstance(v, float):
            v = f"{v:,.6g}" if abs(v) < 1e6 else f"{v:,.4e}"
        elif isinstance(v, int) and not isinstance(v, bool):
            v = f"{v:,}"
        elif isinstance(v, dict):
            v = ", ".join(f"{a}={b:.4g}" if isinstance(b, float) else f"{a}={b}" for a, b in v.items())
        print(f"{k:<{width}}  {v}")


def write_json(path, data) -> None:
    from tokenfactory.studies.report import to_jsonable

    path.write_text(json.dumps(to_jsonable(data), indent=2) + "\n")


def parse_duration(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        return float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)
    except (ValueError, IndexError):
        raise ConfigError("duration", f"{text!r} is not a duration like 3600, 90m, 1h or 14d") from None
