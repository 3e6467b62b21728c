"""Knative Serving autoscaling settings: a ``Service``'s revision annotations (and the
``config-autoscaler`` ConfigMap), read, written, built into the KPA model.

Keys, ranges and defaults from knative.dev, "Configuring autoscaling" and "Additional
autoscaling configuration for Knative Pod Autoscaler": ``autoscaling.knative.dev/`` ``metric``
(concurrency), ``target`` (default ``container-concurrency-target-default`` 100),
``target-utilization-percentage`` (70), ``window`` (60 s, 6 s-1 h), ``panic-window-percentage``
(10, 1-100), ``panic-threshold-percentage`` (200, 110-1000), ``scale-down-delay`` (0 s, 0-1 h),
``min-scale``, ``max-scale``; ``max-scale-up-rate`` (1000) and ``max-scale-down-rate`` (2) are
cluster-wide ConfigMap keys only. The KPA's tick is 2 s (``tickInterval`` in knative/serving's
autoscaler).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tokenfactory.controllers.formats.common import (
    NotModelled,
    Section,
    format_duration,
    parse_duration_s,
    parse_name,
    parse_number_string,
    read_object_name,
)
from tokenfactory.core.errors import ConfigError
from tokenfactory.core.validation import check_choice

__all__ = ["KnativeSetting", "read_knative", "ANNOTATION_PREFIX"]

ANNOTATION_PREFIX = "autoscaling.knative.dev/"
KPA_CLASS = "kpa.autoscaling.knative.dev"
TICK_S = 2.0


def _fmt(x: float) -> str:
    return str(int(x)) if x == int(x) else repr(x)


@dataclass(frozen=True)
class KnativeSetting:
    """A Knative Service's autoscaling, as read (ConfigMap values where the Service sets none).

    Annotation keys below are under ``autoscaling.knative.dev/`` on the revision template.

    Parameters
    ----------
    name : str
        ``metadata.name`` of the Service.
    metric : str
        ``metric``: ``"concurrency"`` (default; the one modelled), ``"rps"``, ``"cpu"`` or ``"memory"``.
    target : float
        ``target`` (ConfigMap ``container-concurrency-target-default``): the metric per replica
        (>= 0.01; default 100).
    target_utilization_percent : float
        ``target-utilization-percentage`` (ConfigMap ``container-concurrency-target-percentage``):
        the share of ``target`` the KPA aims for (%, 1-100; default 70).
    stable_window_s : float
        ``window`` (ConfigMap ``stable-window``): the stable mode's averaging window (s, 6-3600; default 60).
    panic_window_percent : float
        ``panic-window-percentage``: the panic window as a share of the stable window (%, 1-100; default 10).
    panic_threshold_percent : float
        ``panic-threshold-percentage``: panic mode starts when the panic window asks for this share
        of the current replicas (%, 110-1000; default 200).
    scale_down_delay_s : float
        ``scale-down-delay``: how long a lower recommendation must hold before a scale-down (s, 0-3600;
        default 0).
    min_scale, max_scale : int
        ``min-scale`` and ``max-scale``: replica bounds (>= 0; defaults 0 and 0, a max of 0 is unbounded).
    max_scale_up_rate : float
        ConfigMap ``max-scale-up-rate``: the largest growth factor per decision (> 1; default 1000).
    max_scale_down_rate : float
        ConfigMap ``max-scale-down-rate``: the largest shrink factor per decision (> 1; default 2).
    namespace : str, optional
        ``metadata.namespace`` (default None: not written).
    """

    name: str
    metric: str = "concurrency"
    target: float = 100.0
    target_utilization_percent: float = 70.0
    stable_window_s: float = 60.0
    panic_window_percent: float = 10.0
    panic_threshold_percent: float = 200.0
    scale_down_delay_s: float = 0.0
    min_scale: int = 0
    max_scale: int = 0                      # 0: unbounded
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    namespace: str | None = None
    format: str = field(default="knative", init=False)

    def to_documents(self) -> list[dict]:
        ann = {ANNOTATION_PREFIX + "class": KPA_CLASS,
               ANNOTATION_PREFIX + "metric": self.metric,
               ANNOTATION_PREFIX + "target": _fmt(self.target),
               ANNOTATION_PREFIX + "target-utilization-percentage": _fmt(self.target_utilization_percent),
               ANNOTATION_PREFIX + "window": format_duration(self.stable_window_s),
               ANNOTATION_PREFIX + "panic-window-percentage": _fmt(self.panic_window_percent),
               ANNOTATION_PREFIX + "panic-threshold-percentage": _fmt(self.panic_threshold_percent),
               ANNOTATION_PREFIX + "scale-down-delay": format_duration(self.scale_down_delay_s),
               ANNOTATION_PREFIX + "min-scale": str(self.min_scale),
               ANNOTATION_PREFIX + "max-scale": str(self.max_scale)}
        meta: dict[str, Any] = {"name": self.name}
        if self.namespace is not None:
            meta["namespace"] = self.namespace
        docs = [{"apiVersion": "serving.knative.dev/v1", "kind": "Service", "metadata": meta,
                 "spec": {"template": {"metadata": {"annotations": ann}}}}]
        if (self.max_scale_up_rate, self.max_scale_down_rate) != (1000.0, 2.0):
            docs.append({"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"name": "config-autoscaler", "namespace": "knative-serving"},
                         "data": {"max-scale-up-rate": _fmt(self.max_scale_up_rate),
                                  "max-scale-down-rate": _fmt(self.max_scale_down_rate)}})
        return docs

    def controller_params(self) -> dict:
        """Keyword arguments of :class:`tokenfactory.controllers.autoscaling.KnativeAutoscaler`."""
        if self.metric != "concurrency":
            raise NotModelled("autoscaling.knative.dev/metric", f"{self.metric!r}; the model scales on "
                              "concurrency (requests in flight)")
        if self.scale_down_delay_s != 0.0:
            raise NotModelled("autoscaling.knative.dev/scale-down-delay", f"{self.scale_down_delay_s:g} s; the KPA "
                              "model has no scale-down delay")
        return {"target": self.target * self.target_utilization_percent / 100.0, "metric": "decode_concurrency",
                "min_replicas": max(1, self.min_scale), "max_replicas": self.max_scale or 1000,
                "stable_window_s": self.stable_window_s, "panic_window_percent": self.panic_window_percent,
                "panic_threshold_percent": self.panic_threshold_percent,
                "max_scale_up_rate": self.max_scale_up_rate, "max_scale_down_rate": self.max_scale_down_rate,
                "sample_period": TICK_S}

    def build(self, pool: str):
        from tokenfactory.controllers.autoscaling import KnativeAutoscaler

        return KnativeAutoscaler(pool, **self.controller_params())

    def with_params(self, **changes) -> KnativeSetting:
        """Knobs by the model's names: ``target`` (per replica, after utilisation), ``stable_window_s``,
        ``panic_window_percent``, ``panic_threshold_percent``, ``min_replicas``, ``max_replicas``."""
        new = self
        names = {"stable_window_s": "stable_window_s", "panic_window_percent": "panic_window_percent",
                 "panic_threshold_percent": "panic_threshold_percent", "min_replicas": "min_scale",
                 "max_replicas": "max_scale"}
        for key, value in changes.items():
            if key == "target":
                new = replace(new, target=float(value) * 100.0 / new.target_utilization_percent)
            elif key in names:
                new = replace(new, **{names[key]: type(getattr(new, names[key]))(value)})
            else:
                raise ConfigError(f"knative.{key}", "not a knob of this setting; knobs: target, "
                                  + ", ".join(sorted(names)))
        return new


_SERVICE_KEYS = {
    "metric": ("metric", lambda f, v: check_choice(f, v, ("concurrency", "rps", "cpu", "memory"))),
    "target": ("target", lambda f, v: parse_number_string(f, v, low=0.01)),
    "target-utilization-percentage": ("target_utilization_percent",
                                      lambda f, v: parse_number_string(f, v, low=1.0, high=100.0)),
    "window": ("stable_window_s", lambda f, v: parse_duration_s(f, v, low=6.0, high=3600.0)),
    "panic-window-percentage": ("panic_window_percent", lambda f, v: parse_number_string(f, v, low=1.0, high=100.0)),
    "panic-threshold-percentage": ("panic_threshold_percent",
                                   lambda f, v: parse_number_string(f, v, low=110.0, high=1000.0)),
    "scale-down-delay": ("scale_down_delay_s", lambda f, v: parse_duration_s(f, v, low=0.0, high=3600.0)),
    "min-scale": ("min_scale", lambda f, v: int(parse_number_string(f, v, low=0.0))),
    "max-scale": ("max_scale", lambda f, v: int(parse_number_string(f, v, low=0.0))),
}
_CONFIGMAP_KEYS = {
    "max-scale-up-rate": ("max_scale_up_rate", lambda f, v: parse_number_string(f, v, low=1.0, low_inclusive=False)),
    "max-scale-down-rate": ("max_scale_down_rate", lambda f, v: parse_number_string(f, v, low=1.0,
                                                                                  low_inclusive=False)),
    "stable-window": ("stable_window_s", _SERVICE_KEYS["window"][1]),
    "panic-window-percentage": _SERVICE_KEYS["panic-window-percentage"],
    "panic-threshold-percentage": _SERVICE_KEYS["panic-threshold-percentage"],
    "scale-down-delay": _SERVICE_KEYS["scale-down-delay"],
    "container-concurrency-target-default": ("target", _SERVICE_KEYS["target"][1]),
    "container-concurrency-target-percentage": _SERVICE_KEYS["target-utilization-percentage"],
}
#: annotation keys with no effect on the KPA's decisions once a revision serves
_IGNORED = {"initial-scale", "activation-scale", "scale-to-zero-pod-retention-period", "target-burst-capacity"}


def read_knative(docs: list[dict], where: str = "knative") -> KnativeSetting:
    """The :class:`KnativeSetting` of a Service (and an optional ``config-autoscaler`` ConfigMap).

    Parameters
    ----------
    docs : list of dict
        The file's parsed YAML documents: one Knative ``Service`` and at most one ``ConfigMap``
        named ``config-autoscaler``.
    where : str
        Name of the file or object, the root of every error's path (default ``"knative"``).

    Raises
    ------
    ConfigError
        For a missing required field, a value out of range, or an unknown field (named by its
        path); :class:`NotModelled` for a non-KPA autoscaler class.
    """
    services = [d for d in docs if d.get("kind") == "Service"]
    maps = [d for d in docs if d.get("kind") == "ConfigMap"]
    if len(services) != 1 or len(maps) > 1 or len(services) + len(maps) != len(docs):
        raise ConfigError(where, "expected one Knative Service (and at most one config-autoscaler ConfigMap); found "
                          f"kinds {[d.get('kind') for d in docs]}")
    values: dict[str, Any] = {}
    if maps:
        cm = Section(maps[0], f"{where}[config-autoscaler]")
        cm.ignore("apiVersion", "kind")
        cm_meta = cm.section("metadata")
        if cm_meta.get("name", parse=parse_name) != "config-autoscaler":
            raise ConfigError(cm_meta.path("name"), "the ConfigMap Knative's autoscaler reads is config-autoscaler")
        cm_meta.ignore("namespace", "labels", "annotations")
        cm_meta.close()
        data = cm.section("data")
        for key in list(data.mapping):
            if key in _CONFIGMAP_KEYS:
                attr, parse = _CONFIGMAP_KEYS[key]
                values[attr] = data.get(key, parse=parse)
            elif key == "_example":
                data.ignore(key)
        data.close()
        cm.close()
    top = Section(services[0], where)
    top.get("apiVersion", parse=lambda f, v: check_choice(f, v, ("serving.knative.dev/v1",)))
    top.ignore("kind", "status")
    name, namespace = read_object_name(top)
    spec = top.section("spec")
    spec.ignore("traffic")
    template = spec.section("template")
    template.ignore("spec")   # containers: the engine itself, not the autoscaler
    tmeta = template.section("metadata")
    tmeta.ignore("labels", "name")
    ann = tmeta.section("annotations")
    for key in list(ann.mapping):
        if not str(key).startswith(ANNOTATION_PREFIX):
            ann.ignore(key)
            continue
        short = key[len(ANNOTATION_PREFIX):]
        if short == "class":
            cls = ann.get(key, parse=parse_name)
            if cls != KPA_CLASS:
                raise NotModelled(ann.path(key), f"{cls!r}; the model is the KPA ({KPA_CLASS})")
        elif short in _SERVICE_KEYS:
            attr, parse = _SERVICE_KEYS[short]
            values[attr] = ann.get(key, parse=parse)
        elif short in _IGNORED:
            ann.ignore(key)
    ann.close()
    tmeta.close()
    template.close()
    spec.close()
    top.close()
    if values.get("max_scale", 0) and values.get("min_scale", 0) > values["max_scale"]:
        raise ConfigError(ann.path("min-scale"), f"min-scale {values['min_scale']} exceeds max-scale "
                          f"{values['max_scale']}")
    return KnativeSetting(name=name, namespace=namespace, **values)
