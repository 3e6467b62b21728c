"""Prometheus text exposition: counters, gauges and histograms with labels, and a parser.

The emulator and the gateway write their ``/metrics`` with these (text format 0.0.4: ``# HELP``,
``# TYPE``, one sample per line, histograms as cumulative ``_bucket{le=...}`` plus ``_sum`` and
``_count``); the gateway reads an upstream's ``/metrics`` back with :func:`parse_text`. No
client library: the format is small, and writing it here keeps one process per server.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable, Mapping, Sequence

from tokenfactory.core.errors import ConfigError

__all__ = ["Counter", "Gauge", "Histogram", "Registry", "parse_text", "Sample", "sample_value"]

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def _fmt(v: float) -> str:
    if v == math.inf:
        return "+Inf"
    if v == -math.inf:
        return "-Inf"
    if v != v:
        return "NaN"
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(float(v))


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{k}="{_escape(str(v))}"' for k, v in zip(names, values)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Metric:
    kind = ""

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()):
        if not _NAME.match(name):
            raise ConfigError("metric.name", f"{name!r} is not a Prometheus metric name")
        self.name, self.help, self.labelnames = name, help_text, tuple(labelnames)
        self.children: dict[tuple, object] = {}

    def _key(self, labels: Mapping[str, str] | None) -> tuple:
        labels = labels or {}
        if set(labels) != set(self.labelnames):
            raise ConfigError(f"metric.{self.name}.labels", f"expected {self.labelnames}, got {sorted(labels)}")
        return tuple(str(labels[k]) for k in self.labelnames)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    """A monotone counter; exposed as ``NAME_total`` (the OpenMetrics convention vLLM's client uses).

    Parameters
    ----------
    name : str
        Metric name (``vllm:prompt_tokens``).
    help_text : str
        The ``# HELP`` line.
    labelnames : sequence of str
        Label names (values are given per update).
    """

    kind = "counter"

    def inc(self, amount: float = 1.0, labels: Mapping[str, str] | None = None) -> None:
        if amount < 0:
            raise ConfigError(f"metric.{self.name}", "a counter only increases")
        k = self._key(labels)
        self.children[k] = self.children.get(k, 0.0) + amount

    def value(self, labels: Mapping[str, str] | None = None) -> float:
        return float(self.children.get(self._key(labels), 0.0))

    def lines(self) -> list[str]:
        base = self.name[:-6] if self.name.endswith("_total") else self.name
        out = [f"# HELP {base} {self.help}", f"# TYPE {base} counter"]
        out += [f"{base}_total{_labels(self.labelnames, k)} {_fmt(v)}" for k, v in self.children.items()]
        return out


class Gauge(_Metric):
    """A value that goes up and down (set, or read from a callable at exposition time).

    Parameters
    ----------
    name : str
        Metric name (``vllm:prompt_tokens``).
    help_text : str
        The ``# HELP`` line.
    labelnames : sequence of str
        Label names (values are given per update).
    """

    kind = "gauge"

    def set(self, value: float, labels: Mapping[str, str] | None = None) -> None:
        self.children[self._key(labels)] = float(value)

    def set_function(self, fn, labels: Mapping[str, str] | None = None) -> None:
        self.children[self._key(labels)] = fn

    def value(self, labels: Mapping[str, str] | None = None) -> float:
        v = self.children.get(self._key(labels), 0.0)
        return float(v() if callable(v) else v)

    def lines(self) -> list[str]:
        return self.header() + [f"{self.name}{_labels(self.labelnames, k)} {_fmt(v() if callable(v) else v)}"
                                for k, v in self.children.items()]


class Histogram(_Metric):
    """Cumulative buckets (upper bounds ``le``, +Inf added), ``_sum`` and ``_count``.

    Parameters
    ----------
    name : str
        Metric name (``vllm:prompt_tokens``).
    help_text : str
        The ``# HELP`` line.
    buckets : iterable of float
        Upper bounds (``+Inf`` is added).
    labelnames : sequence of str
        Label names (values are given per update).
    """

    kind = "histogram"

    def __init__(self, name: str, help_text: str, buckets: Iterable[float], labelnames: Sequence[str] = ()):
        super().__init__(name, help_text, labelnames)
        b = sorted(float(x) for x in buckets if x != math.inf)
        if not b:
            raise ConfigError(f"metric.{name}.buckets", "needs at least one finite bucket")
        self.buckets = tuple(b)

    def observe(self, value: float, labels: Mapping[str, str] | None = None, count: int = 1) -> None:
        """Record ``count`` observations of ``value``."""
        k = self._key(labels)
        st = self.children.get(k)
        if st is None:
            st = self.children[k] = [[0] * (len(self.buckets) + 1), 0.0, 0]
        st[0][bisect.bisect_left(self.buckets, value)] += count
        st[1] += value * count
        st[2] += count

    def count(self, labels: Mapping[str, str] | None = None) -> int:
        st = self.children.get(self._key(labels))
        return int(st[2]) if st else 0

    def lines(self) -> list[str]:
        out = self.header()
        for k, (counts, total, n) in self.children.items():
            cum = 0
            for le, c in zip((*self.buckets, math.inf), counts):
                cum += c
                le_label = 'le="' + _fmt(le) + '"'
                out.append(f"{self.name}_bucket{_labels(self.labelnames, k, le_label)} {cum}")
            out.append(f"{self.name}_sum{_labels(self.labelnames, k)} {_fmt(total)}")
            out.append(f"{self.name}_count{_labels(self.labelnames, k)} {n}")
        return out


class Registry:
    """The metrics of one server, exposed in registration order."""

    def __init__(self):
        self.metrics: list[_Metric] = []

    def add(self, metric: _Metric) -> _Metric:
        self.metrics.append(metric)
        return metric

    def counter(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> Counter:
        return self.add(Counter(name, help_text, labelnames))

    def gauge(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> Gauge:
        return self.add(Gauge(name, help_text, labelnames))

    def histogram(self, name: str, help_text: str, buckets: Iterable[float], labelnames: Sequence[str] = ()
                  ) -> Histogram:
        return self.add(Histogram(name, help_text, buckets, labelnames))

    def render(self) -> str:
        """The text exposition (ends with a newline)."""
        lines: list[str] = []
        for m in self.metrics:
            lines += m.lines()
        return "\n".join(lines) + "\n"


class Sample(tuple):
    """``(name, labels dict, value)`` of one exposition line."""

    __slots__ = ()

    def __new__(cls, name: str, labels: dict, value: float):
        return super().__new__(cls, (name, labels, value))

    name = property(lambda s: s[0])
    labels = property(lambda s: s[1])
    value = property(lambda s: s[2])


_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_text(text: str) -> list[Sample]:
    """Parse a Prometheus text exposition into samples (comments skipped; a malformed line is a
    :class:`ConfigError` naming its number).

    Parameters
    ----------
    text : str
        The body of a ``/metrics`` response.

    Returns
    -------
    list of Sample
    """
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            raise ConfigError(f"metrics.line[{n}]", f"not a Prometheus sample: {raw[:80]!r}")
        labels = {k: v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
                  for k, v in _LABEL.findall(m.group(3) or "")}
        try:
            value = float(m.group(4).replace("+Inf", "inf").replace("-Inf", "-inf"))
        except ValueError:
            raise ConfigError(f"metrics.line[{n}]", f"value {m.group(4)!r} is not a number") from None
        out.append(Sample(m.group(1), labels, value))
    return out


def sample_value(samples: Iterable[Sample], name: str, default: float = math.nan, **labels: str) -> float:
    """The sum over the samples named ``name`` whose labels include ``labels`` (``default`` when none).

    Parameters
    ----------
    samples : iterable of Sample
        From :func:`parse_text`.
    name : str
        Sample name (``vllm:num_requests_running``, ``..._total``).
    default : float
        Returned when no sample matches.
    **labels : str
        Label values a sample must have.

    Returns
    -------
    float
    """
    total, found = 0.0, False
    for s in samples:
        if s[0] == name and all(s[1].get(k) == v for k, v in labels.items()):
            total += s[2]
            found = True
    return total if found else default
