"""What every control-plane settings reader shares: strict field-by-field reading, the value
syntaxes of Kubernetes-style files, and the engine metrics a setting may scale on.

A :class:`Section` reads a mapping one key at a time and records what it consumed; ``close()``
then rejects every key nobody read, naming its full path (``spec.behavior.scaleUp.polcies``), so
a misspelt or unsupported field is an error, never silently ignored.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tokenfactory.core.errors import ConfigError

__all__ = ["Section", "read_object_name", "read_target_ref", "OBJECT_METADATA_KEPT", "parse_name", "parse_duration_s", "format_duration", "parse_quantity", "format_quantity",
           "parse_number_string", "EngineMetric", "ENGINE_METRICS", "engine_metric", "NotModelled"]


class NotModelled(ConfigError):
    """A field the format allows but tokenfactory's model of that control plane does not capture.

    Parameters
    ----------
    field : str
        Path of the field in the file (``"spec.behavior.scaleUp.selectPolicy"``), named in the message.
    why : str
        What the model lacks, in a phrase; the message reads ``not modelled: <why>``.
    """

    def __init__(self, field: str, why: str):
        super().__init__(field, f"not modelled: {why}")


_MISSING = object()


class Section:
    """A mapping read field by field; unknown keys are rejected by :meth:`close`.

    Parameters
    ----------
    mapping : mapping or None
        The section as parsed (None reads as empty).
    where : str
        Dotted path of the section, used in every error.
    """

    def __init__(self, mapping: Mapping[str, Any] | None, where: str):
        if mapping is None:
            mapping = {}
        if not isinstance(mapping, Mapping):
            raise ConfigError(where, f"expected a mapping, got {type(mapping).__name__}")
        self.mapping, self.where, self._read = mapping, where, set()

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def __contains__(self, key: str) -> bool:
        return key in self.mapping

    def get(self, key: str, default: Any = _MISSING, parse: Callable[[str, Any], Any] | None = None) -> Any:
        """The value of ``key`` parsed by ``parse(field, value)``; ``default`` when absent
        (absent without a default is an error naming the field)."""
        self._read.add(key)
        if key not in self.mapping:
            if default is _MISSING:
                import difflib

                near = difflib.get_close_matches(key, [str(k) for k in self.mapping if k not in self._read], n=1)
                if near:
                    raise ConfigError(self.path(near[0]), f"unknown field; did you mean {key!r} (required)?")
                raise ConfigError(self.path(key), "required field is missing")
            return default
        value = self.mapping[key]
        return parse(self.path(key), value) if parse else value

    def section(self, key: str) -> Section:
        """The sub-mapping ``key`` (empty when absent)."""
        return Section(self.get(key, None), self.path(key))

    def sections(self, key: str) -> list[Section]:
        """The list of mappings ``key`` (empty when absent)."""
        items = self.get(key, None)
        if items is None:
            return []
        if not isinstance(items, list):
            raise ConfigError(self.path(key), f"expected a list, got {type(items).__name__}")
        return [Section(item, f"{self.path(key)}[{i}]") for i, item in enumerate(items)]

    def ignore(self, *keys: str) -> None:
        """Mark ``keys`` as read although they carry nothing the model uses (names, labels)."""
        self._read.update(keys)

    def close(self) -> None:
        """Raise :class:`ConfigError` for the first key that no reader consumed."""
        for key in self.mapping:
            if key not in self._read:
                raise ConfigError(self.path(str(key)), "unknown or unsupported field; the fields read here are "
                                  + ", ".join(sorted(self._read)))


def parse_name(field: str, value: Any) -> str:
    """A non-empty string (an object, metric or deployment name).

    Parameters
    ----------
    field : str
        Path of the field, used in the error message.
    value : any
        The value read; must be a string with at least one non-blank character.

    Returns
    -------
    str
        ``value`` unchanged.

    Raises
    ------
    ConfigError
        When ``value`` is not a string or is blank.
    """
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(field, f"expected a non-empty name, got {value!r}")
    return value


#: object metadata that carries nothing a control loop uses (kept as written, not modelled)
OBJECT_METADATA_KEPT = ("labels", "annotations", "uid", "resourceVersion", "creationTimestamp", "generation",
                        "managedFields")


def read_object_name(top: Section) -> tuple[str, str | None]:
    """A Kubernetes object's ``metadata.name`` and ``metadata.namespace`` (the rest of its
    metadata is kept, :data:`OBJECT_METADATA_KEPT`; anything else is an unknown field).

    Parameters
    ----------
    top : Section
        The object.

    Returns
    -------
    tuple
        ``(name, namespace or None)``.
    """
    meta = top.section("metadata")
    name = meta.get("name", parse=parse_name)
    namespace = meta.get("namespace", None)
    meta.ignore(*OBJECT_METADATA_KEPT)
    meta.close()
    return name, namespace


def read_target_ref(spec: Section, *, default_kind: str | None = None, kept: tuple[str, ...] = ()) -> tuple[str, str, str]:
    """``spec.scaleTargetRef`` of an autoscaler object.

    Parameters
    ----------
    spec : Section
        The object's spec.
    default_kind : str, optional
        The target's kind when the file omits it (KEDA: ``Deployment``); None makes it required.
    kept : tuple of str
        Further fields of the reference that are kept, not modelled.

    Returns
    -------
    tuple
        ``(apiVersion, kind, name)``.
    """
    ref = spec.section("scaleTargetRef")
    api = ref.get("apiVersion", "apps/v1")
    kind = ref.get("kind", default_kind) if default_kind is not None else ref.get("kind", parse=parse_name)
    name = ref.get("name", parse=parse_name)
    ref.ignore(*kept)
    ref.close()
    return api, kind, name


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration_s(field: str, value: Any, *, low: float = 0.0, high: float = math.inf) -> float:
    """A Go duration (``"60s"``, ``"1m30s"``, ``"500ms"``; Knative and AIBrix annotations) or a
    plain number of seconds, as seconds within [low, high].

    Parameters
    ----------
    field : str
        Path of the field, used in the error message.
    value : str or number
        A Go duration string (units ns, us, µs, ms, s, m, h), a numeric string or a number of seconds.
    low, high : float
        Closed range of the result (s; defaults 0 and inf).

    Returns
    -------
    float
        The duration in seconds.

    Raises
    ------
    ConfigError
        When ``value`` is not a duration or lies outside [low, high].
    """
    if isinstance(value, bool):
        raise ConfigError(field, f"expected a duration such as '60s', got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"\d+(\.\d*)?", text):
            seconds = float(text)
        else:
            pos, seconds = 0, 0.0
            for m in _DURATION.finditer(text):
                if m.start() != pos:
                    break
                seconds += float(m.group(1)) * _UNIT_S[m.group(2)]
                pos = m.end()
            if pos != len(text) or not text:
                raise ConfigError(field, f"not a duration: {value!r} (use e.g. '60s', '1m30s', '500ms')")
    else:
        raise ConfigError(field, f"expected a duration such as '60s', got {type(value).__name__}")
    if not (low <= seconds <= high):
        raise ConfigError(field, f"{seconds:g} s is outside the allowed range [{low:g} s, {high:g} s]")
    return seconds


def format_duration(seconds: float) -> str:
    """Seconds as the shortest Go duration string that reads back exactly (``"60s"``).

    Parameters
    ----------
    seconds : float
        The duration (s, finite); whole seconds are written without a fraction.
    """
    if seconds == int(seconds):
        return f"{int(seconds)}s"
    return f"{seconds!r}s"


_QUANTITY = re.compile(r"([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_SUFFIX = {None: 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
           "Ki": 2.0 ** 10, "Mi": 2.0 ** 20, "Gi": 2.0 ** 30, "Ti": 2.0 ** 40, "Pi": 2.0 ** 50, "Ei": 2.0 ** 60}


def parse_quantity(field: str, value: Any, *, positive: bool = True) -> float:
    """A Kubernetes resource quantity (``"2"``, ``"500m"``, ``1.5``) as a float.

    Parameters
    ----------
    field : str
        Path of the field, used in the error message.
    value : str or number
        A number or a quantity string with an optional SI (``m``, ``k``, ``M``, ...) or binary
        (``Ki``, ``Mi``, ...) suffix.
    positive : bool
        Require a result > 0 (default True); otherwise any finite value is accepted.

    Returns
    -------
    float
        The quantity in plain units (``"500m"`` is 0.5).

    Raises
    ------
    ConfigError
        When ``value`` is not a quantity, is not finite, or is <= 0 with ``positive``.
    """
    if isinstance(value, bool):
        raise ConfigError(field, f"expected a quantity such as '2' or '500m', got {value!r}")
    if isinstance(value, (int, float)):
        x = float(value)
    elif isinstance(value, str) and (m := _QUANTITY.fullmatch(value.strip())):
        x = float(m.group(1)) * _SUFFIX[m.group(2)]
    else:
        raise ConfigError(field, f"not a Kubernetes quantity: {value!r} (e.g. '2', '500m', '1.5')")
    if not math.isfinite(x) or (positive and x <= 0):
        raise ConfigError(field, f"must be a finite quantity > 0, got {value!r}")
    return x


def format_quantity(x: float) -> str:
    """A float as a quantity string that reads back exactly (milli-units where that is exact).

    Parameters
    ----------
    x : float
        The value (finite); whole numbers are written without a suffix, e.g. 0.5 as ``"500m"``.
    """
    if x == int(x):
        return str(int(x))
    milli = x * 1000.0
    if milli == int(milli) and abs(milli) < 1e15:
        return f"{int(milli)}m"
    return repr(x)


def parse_number_string(field: str, value: Any, *, low: float | None = None, high: float | None = None,
                        low_inclusive: bool = True) -> float:
    """A number written as a string (annotations and labels are strings) or as a number.

    Parameters
    ----------
    field : str
        Path of the field, used in the error message.
    value : str or number
        The value read; anything ``float()`` accepts except booleans.
    low, high : float, optional
        Bounds of the allowed range, in the field's own unit; ``None`` (default) is unbounded.
    low_inclusive : bool
        Whether ``low`` itself is allowed (default True); ``high`` is always inclusive.

    Returns
    -------
    float
        ``value`` as a finite float.

    Raises
    ------
    ConfigError
        When ``value`` is not a finite number or lies outside the range.
    """
    if isinstance(value, bool):
        raise ConfigError(field, f"expected a number, got {value!r}")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ConfigError(field, f"expected a number, got {value!r}") from None
    if not math.isfinite(x):
        raise ConfigError(field, f"must be finite, got {value!r}")
    if low is not None and (x < low or (x == low and not low_inclusive)):
        raise ConfigError(field, f"{x:g} is below the allowed minimum {low:g}" + ("" if low_inclusive else
                                                                                  " (exclusive)"))
    if high is not None and x > high:
        raise ConfigError(field, f"{x:g} is above the allowed maximum {high:g}")
    return x


@dataclass(frozen=True)
class EngineMetric:
    """An engine metric a control plane may scale on, and the plant signal it corresponds to.

    Parameters
    ----------
    signal : str
        The key of :data:`tokenfactory.controllers.autoscaling.POOL_METRICS` that measures it.
    per_replica : bool
        Whether the signal is a per-replica average (HPA's ``AverageValue``) or a pool total.
    meaning : str
        What the engine reports, in a line.
    """

    signal: str
    per_replica: bool
    meaning: str


#: engine metric names (vLLM's exported names, old and new; SGLang's) -> plant signal.
#: vLLM metric names: docs.vllm.ai "Production Metrics" (v0.10+: kv_cache_usage_perc replaced
#: gpu_cache_usage_perc). SGLang: docs.sglang.ai "Production Metrics".
ENGINE_METRICS: dict[str, EngineMetric] = {
    "vllm:num_requests_waiting": EngineMetric("decode_waiting", True, "requests waiting for a decode slot per replica"),
    "sglang:num_queue_reqs": EngineMetric("decode_waiting", True, "requests waiting in the queue per replica"),
    "vllm:kv_cache_usage_perc": EngineMetric("kv_occupancy", True, "KV-cache usage, 0-1"),
    "vllm:gpu_cache_usage_perc": EngineMetric("kv_occupancy", True, "KV-cache usage, 0-1 (vLLM < 0.10 name)"),
    "kv_cache_usage_perc": EngineMetric("kv_occupancy", True, "KV-cache usage, 0-1 (AIBrix's pod metric name)"),
    "gpu_cache_usage_perc": EngineMetric("kv_occupancy", True, "KV-cache usage, 0-1 (AIBrix's pod metric name)"),
    "sglang:token_usage": EngineMetric("kv_occupancy", True, "KV token usage, 0-1"),
    "concurrency": EngineMetric("decode_concurrency", False, "requests in flight (Knative's concurrency)"),
    "ongoing_requests": EngineMetric("decode_concurrency", False, "requests in flight (Ray Serve)"),
}


def engine_metric(field: str, name: str) -> EngineMetric:
    """The :class:`EngineMetric` called ``name``, or an error listing the ones modelled.

    Parameters
    ----------
    field : str
        Path of the field that names the metric, used in the error message.
    name : str
        An engine metric name, a key of :data:`ENGINE_METRICS` (``"vllm:num_requests_waiting"``).

    Raises
    ------
    NotModelled
        When ``name`` is not a key of :data:`ENGINE_METRICS`.
    """
    if not isinstance(name, str) or name not in ENGINE_METRICS:
        raise NotModelled(field, f"metric {name!r} has no plant signal; modelled metrics: "
                          + ", ".join(sorted(ENGINE_METRICS)))
    return ENGINE_METRICS[name]
