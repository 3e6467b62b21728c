"""AIBrix ``PodAutoscaler`` (``autoscaling.aibrix.ai/v1alpha1``) settings: read, write, build.

Spec fields from AIBrix's ``api/autoscaling/v1alpha1/podautoscaler_types.go`` (scaleTargetRef,
minReplicas, maxReplicas, metricsSources with one source - ``GetPaMetricSources`` rejects more -
and scalingStrategy HPA/KPA/APA); tuning annotations from its scaling contexts
(``pkg/controller/podautoscaler/common/context.go`` and the APA/KPA contexts) and documentation:
``autoscaling.aibrix.ai/max-scale-up-rate`` / ``max-scale-down-rate`` (2 / 2),
``autoscaling.aibrix.ai/up-fluctuation-tolerance`` / ``down-fluctuation-tolerance`` (0.1 / 0.2 in
the APA docs; the ``apa.`` prefixed keys of older releases are read too), ``apa.autoscaling.aibrix.ai/window``,
and for KPA ``kpa.autoscaling.aibrix.ai/stable-window``, ``panic-window``, ``panic-threshold``,
``scale-down-delay``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tokenfactory.controllers.formats.common import (
    NotModelled,
    Section,
    engine_metric,
    format_duration,
    parse_duration_s,
    parse_name,
    parse_number_string,
    read_target_ref,
)
from tokenfactory.core.errors import ConfigError
from tokenfactory.core.validation import check_choice, check_int

__all__ = ["AIBrixSetting", "read_aibrix"]

API_VERSION = "autoscaling.aibrix.ai/v1alpha1"
PREFIX = "autoscaling.aibrix.ai/"

#: annotation key -> (attribute, parser, default)
_ANNOTATIONS: dict[str, tuple[str, Any]] = {
    PREFIX + "max-scale-up-rate": ("max_scale_up_rate", lambda f, v: parse_number_string(f, v, low=1.0)),
    PREFIX + "max-scale-down-rate": ("max_scale_down_rate", lambda f, v: parse_number_string(f, v, low=1.0)),
    PREFIX + "up-fluctuation-tolerance": ("up_tolerance", lambda f, v: parse_number_string(f, v, low=0.0, high=1.0)),
    PREFIX + "down-fluctuation-tolerance": ("down_tolerance",
                                            lambda f, v: parse_number_string(f, v, low=0.0, high=1.0)),
    "apa." + PREFIX + "up-fluctuation-tolerance": ("up_tolerance",
                                                   lambda f, v: parse_number_string(f, v, low=0.0, high=1.0)),
    "apa." + PREFIX + "down-fluctuation-tolerance": ("down_tolerance",
                                                     lambda f, v: parse_number_string(f, v, low=0.0, high=1.0)),
    "apa." + PREFIX + "window": ("window_s", lambda f, v: parse_duration_s(f, v, low=1.0, high=3600.0)),
    "kpa." + PREFIX + "stable-window": ("window_s", lambda f, v: parse_duration_s(f, v, low=6.0, high=3600.0)),
    "kpa." + PREFIX + "panic-window": ("panic_window_s", lambda f, v: parse_duration_s(f, v, low=1.0, high=3600.0)),
    "kpa." + PREFIX + "panic-threshold": ("panic_threshold", lambda f, v: parse_number_string(f, v, low=1.1,
                                                                                           high=10.0)),
    "kpa." + PREFIX + "scale-down-delay": ("scale_down_delay_s",
                                          lambda f, v: parse_duration_s(f, v, low=0.0, high=3600.0)),
}
_WRITE_KEYS = {"max_scale_up_rate": PREFIX + "max-scale-up-rate", "max_scale_down_rate": PREFIX + "max-scale-down-rate",
               "up_tolerance": PREFIX + "up-fluctuation-tolerance",
               "down_tolerance": PREFIX + "down-fluctuation-tolerance"}


def _fmt(x: float) -> str:
    return str(int(x)) if x == int(x) else repr(x)


@dataclass(frozen=True)
class AIBrixSetting:
    """A PodAutoscaler, as read; AIBrix's defaults filled in.

    Parameters
    ----------
    name : str
        ``metadata.name`` of the PodAutoscaler.
    target_kind, target_name : str
        ``spec.scaleTargetRef.kind`` and ``.name``: the workload it scales.
    strategy : str
        ``spec.scalingStrategy``: ``"HPA"``, ``"KPA"`` or ``"APA"``.
    metric : str
        ``spec.metricsSources[0].targetMetric``: an engine metric of
        :data:`~tokenfactory.controllers.formats.common.ENGINE_METRICS`.
    target_value : float
        ``spec.metricsSources[0].targetValue``: the metric per pod it aims for (> 0).
    max_replicas : int
        ``spec.maxReplicas`` (>= max(1, min_replicas)).
    min_replicas : int
        ``spec.minReplicas`` (>= 0; default 1).
    namespace : str, optional
        ``metadata.namespace`` (default None: not written).
    target_api_version : str
        ``spec.scaleTargetRef.apiVersion`` (default ``"apps/v1"``).
    metric_port, metric_path, metric_protocol : str, optional
        ``port``, ``path`` and ``protocolType`` of the metrics source: where the pod metric is
        scraped (default None: not written); kept as written, not modelled.
    max_scale_up_rate, max_scale_down_rate : float
        ``autoscaling.aibrix.ai/max-scale-up-rate`` and ``max-scale-down-rate``: the largest growth
        and shrink factors per decision (>= 1; defaults 2 and 2).
    up_tolerance, down_tolerance : float
        ``autoscaling.aibrix.ai/up-fluctuation-tolerance`` and ``down-fluctuation-tolerance``: the
        APA's band around the target ([0, 1]; defaults 0.1 and 0.2); the HPA strategy's tolerance
        is ``up_tolerance``.
    window_s : float, optional
        ``apa.autoscaling.aibrix.ai/window`` (APA; s, 1-3600) or ``kpa.autoscaling.aibrix.ai/stable-window``
        (KPA; s, 6-3600): the metric window (default None: AIBrix's).
    panic_window_s : float, optional
        ``kpa.autoscaling.aibrix.ai/panic-window``: the KPA's panic window (s, 1-3600; default None).
    panic_threshold : float, optional
        ``kpa.autoscaling.aibrix.ai/panic-threshold``: the KPA enters panic mode above this ratio of
        desired to current replicas (1.1-10; default None).
    scale_down_delay_s : float, optional
        ``kpa.autoscaling.aibrix.ai/scale-down-delay`` (s, 0-3600; default None).
    """

    name: str
    target_kind: str
    target_name: str
    strategy: str                       # "HPA", "KPA" or "APA"
    metric: str
    target_value: float
    max_replicas: int
    min_replicas: int = 1
    namespace: str | None = None
    target_api_version: str = "apps/v1"
    metric_port: str | None = None
    metric_path: str | None = None
    metric_protocol: str | None = None
    max_scale_up_rate: float = 2.0
    max_scale_down_rate: float = 2.0
    up_tolerance: float = 0.1
    down_tolerance: float = 0.2
    window_s: float | None = None
    panic_window_s: float | None = None
    panic_threshold: float | None = None
    scale_down_delay_s: float | None = None
    format: str = field(default="aibrix", init=False)

    def to_documents(self) -> list[dict]:
        ann = {key: _fmt(getattr(self, attr)) for attr, key in _WRITE_KEYS.items()}
        if self.window_s is not None:
            ann[("apa." if self.strategy == "APA" else "kpa.") + PREFIX + ("window" if self.strategy == "APA"
                                                                          else "stable-window")] = \
                format_duration(self.window_s)
        for attr, key in (("panic_window_s", "panic-window"), ("scale_down_delay_s", "scale-down-delay")):
            if getattr(self, attr) is not None:
                ann["kpa." + PREFIX + key] = format_duration(getattr(self, attr))
        if self.panic_threshold is not None:
            ann["kpa." + PREFIX + "panic-threshold"] = _fmt(self.panic_threshold)
        meta: dict[str, Any] = {"name": self.name, "annotations": ann}
        if self.namespace is not None:
            meta["namespace"] = self.namespace
        source: dict[str, Any] = {"metricSourceType": "pod"}
        for key, attr in (("protocolType", "metric_protocol"), ("port", "metric_port"), ("path", "metric_path")):
            if getattr(self, attr) is not None:
                source[key] = getattr(self, attr)
        source.update(targetMetric=self.metric, targetValue=_fmt(self.target_value))
        spec = {"scaleTargetRef": {"apiVersion": self.target_api_version, "kind": self.target_kind,
                                   "name": self.target_name},
                "minReplicas": self.min_replicas, "maxReplicas": self.max_replicas,
                "metricsSources": [source], "scalingStrategy": self.strategy}
        return [{"apiVersion": API_VERSION, "kind": "PodAutoscaler", "metadata": meta, "spec": spec}]

    def controller_params(self) -> dict:
        """Keyword arguments of the matching autoscaler (``AIBrixAPA``, ``KnativeAutoscaler`` or
        ``HorizontalPodAutoscaler``)."""
        em = engine_metric("spec.metricsSources[0].targetMetric", self.metric)
        common = {"target": self.target_value, "metric": em.signal, "min_replicas": max(1, self.min_replicas),
                  "max_replicas": self.max_replicas}
        if self.strategy == "APA":
            for attr, default in (("max_scale_up_rate", 2.0), ("max_scale_down_rate", 2.0), ("window_s", None)):
                if getattr(self, attr) != default:
                    raise NotModelled(f"metadata.annotations[{attr}]", f"{getattr(self, attr)}: the APA model has "
                                      "no metric window or scale-rate caps")
            return {**common, "up_band": self.up_tolerance, "down_band": self.down_tolerance}
        if self.strategy == "KPA":
            if self.scale_down_delay_s:
                raise NotModelled("metadata.annotations[kpa scale-down-delay]", "the KPA model has no scale-down delay")
            out = {**common, "max_scale_up_rate": self.max_scale_up_rate, "max_scale_down_rate": self.max_scale_down_rate}
            if self.window_s is not None:
                out["stable_window_s"] = self.window_s
            if self.panic_window_s is not None:
                out["panic_window_percent"] = 100.0 * self.panic_window_s / (self.window_s or 60.0)
            if self.panic_threshold is not None:
                out["panic_threshold_percent"] = 100.0 * self.panic_threshold
            return out
        return {**common, "tolerance": self.up_tolerance}

    def build(self, pool: str):
        from tokenfactory.controllers.autoscaling import AIBrixAPA, HorizontalPodAutoscaler, KnativeAutoscaler

        cls = {"APA": AIBrixAPA, "KPA": KnativeAutoscaler, "HPA": HorizontalPodAutoscaler}[self.strategy]
        return cls(pool, **self.controller_params())

    def with_params(self, **changes) -> AIBrixSetting:
        """Knobs by the model's names: ``target``, ``up_band``, ``down_band``, ``min_replicas``, ``max_replicas``."""
        names = {"target": "target_value", "up_band": "up_tolerance", "down_band": "down_tolerance",
                 "min_replicas": "min_replicas", "max_replicas": "max_replicas"}
        out = {}
        for key, value in changes.items():
            if key not in names:
                raise ConfigError(f"aibrix.{key}", "not a knob of this setting; knobs: " + ", ".join(sorted(names)))
            out[names[key]] = value
        return replace(self, **out)


def read_aibrix(docs: list[dict], where: str = "aibrix") -> AIBrixSetting:
    """The :class:`AIBrixSetting` of one PodAutoscaler document.

    Parameters
    ----------
    docs : list of dict
        The file's parsed YAML documents: exactly one ``PodAutoscaler``.
    where : str
        Name of the file or object, the root of every error's path (default ``"aibrix"``).

    Raises
    ------
    ConfigError
        For a missing required field, a value out of range, or an unknown field (named by its
        path); :class:`NotModelled` for a valid field tokenfactory does not model.
    """
    if len(docs) != 1 or docs[0].get("kind") != "PodAutoscaler":
        raise ConfigError(where, f"expected one PodAutoscaler document; found kinds {[d.get('kind') for d in docs]}")
    top = Section(docs[0], where)
    top.get("apiVersion", parse=lambda f, v: check_choice(f, v, (API_VERSION,)))
    top.ignore("kind", "status")
    meta = top.section("metadata")
    name = meta.get("name", parse=parse_name)
    namespace = meta.get("namespace", None)
    values: dict[str, Any] = {}
    for block in ("labels", "annotations"):   # AIBrix reads its keys from either
        sec = meta.section(block)
        for key in list(sec.mapping):
            if key in _ANNOTATIONS:
                attr, parse = _ANNOTATIONS[key]
                values[attr] = sec.get(key, parse=parse)
            elif PREFIX in str(key):
                continue    # left unread: close() names it as unknown
            else:
                sec.ignore(key)
        sec.close()
    meta.ignore("uid", "resourceVersion", "creationTimestamp", "generation")
    meta.close()
    spec = top.section("spec")
    api, kind, target = read_target_ref(spec, kept=("namespace",))
    if spec.get("subTargetSelector", None) is not None:
        raise NotModelled(spec.path("subTargetSelector"), "scaling one role of a StormService")
    for key in ("schedules", "predictive", "observeWindowSeconds", "panicWindowSeconds"):
        if spec.get(key, None) is not None:
            raise NotModelled(spec.path(key), "newer AIBrix scheduling/prediction/window fields")
    min_r = spec.get("minReplicas", 1, lambda f, v: check_int(f, v, low=0))
    max_r = spec.get("maxReplicas", parse=lambda f, v: check_int(f, v, low=max(1, min_r)))
    strategy = spec.get("scalingStrategy", parse=lambda f, v: check_choice(f, v, ("HPA", "KPA", "APA")))
    sources = spec.sections("metricsSources")
    if len(sources) != 1:
        raise ConfigError(spec.path("metricsSources"), f"AIBrix supports exactly one metrics source, got {len(sources)}")
    src = sources[0]
    stype = src.get("metricSourceType", parse=lambda f, v: check_choice(f, v, ("pod", "resource", "custom",
                                                                               "external", "domain")))
    if stype != "pod":
        raise NotModelled(src.path("metricSourceType"), f"{stype!r}; the model reads per-pod engine metrics")
    protocol = src.get("protocolType", None)
    port = src.get("port", None)
    path = src.get("path", None)
    src.ignore("endpoint")
    metric = src.get("targetMetric", parse=parse_name)
    value = src.get("targetValue", parse=lambda f, v: parse_number_string(f, v, low=0.0, low_inclusive=False))
    src.close()
    spec.close()
    top.close()
    engine_metric(src.path("targetMetric"), metric)
    return AIBrixSetting(name=name, target_kind=kind, target_name=target, strategy=strategy, metric=metric,
                         target_value=value, max_replicas=max_r, min_replicas=min_r, namespace=namespace,
                         target_api_version=api, metric_port=None if port is None else str(port),
                         metric_path=path, metric_protocol=protocol, **values)
