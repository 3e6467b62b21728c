"""Kubernetes ``HorizontalPodAutoscaler`` (``autoscaling/v2``) settings: read, write, build.

Field names, defaults and ranges follow the autoscaling/v2 API reference (kubernetes.io,
"HorizontalPodAutoscaler v2") and the controller-manager flags (kube-controller-manager
reference: ``--horizontal-pod-autoscaler-sync-period`` 15 s, ``--horizontal-pod-autoscaler-tolerance``
0.1, ``--horizontal-pod-autoscaler-downscale-stabilization`` 5 m). Default ``behavior`` (kubernetes.io,
"Horizontal Pod Autoscaling", default behavior): scale-down stabilisation 300 s and 100 % per 15 s;
scale-up no stabilisation and max(4 pods, 100 %) per 15 s.

The controller-manager settings are not part of an HPA object; a file may carry them as a second
YAML document of kind ``KubeControllerManagerConfiguration`` (``horizontalPodAutoscalerConfig``),
otherwise the defaults above hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tokenfactory.controllers.formats.common import (
    NotModelled,
    Section,
    engine_metric,
    format_duration,
    format_quantity,
    parse_duration_s,
    parse_name,
    parse_number_string,
    parse_quantity,
    read_object_name,
    read_target_ref,
)
from tokenfactory.core.errors import ConfigError
from tokenfactory.core.validation import check_choice, check_int

__all__ = ["ScalingPolicy", "ScalingRules", "MetricTarget", "HPASetting", "read_scaling_rules", "scaling_rules_doc",
           "DEFAULT_SCALE_UP", "DEFAULT_SCALE_DOWN", "read_hpa", "CONTROLLER_MANAGER_KIND"]

API_VERSION = "autoscaling/v2"
CONTROLLER_MANAGER_KIND = "KubeControllerManagerConfiguration"
CONTROLLER_MANAGER_API = "kubecontrollermanager.config.k8s.io/v1alpha1"


@dataclass(frozen=True)
class ScalingPolicy:
    """One HPA scaling policy: change by at most ``value`` pods or percent per ``period_s``.

    Parameters
    ----------
    type : str
        ``policies[].type``: ``"Pods"`` (an absolute count) or ``"Percent"`` (of the current replicas).
    value : int
        ``policies[].value``: the largest change per period, in pods or percent (>= 1).
    period_s : int
        ``policies[].periodSeconds``: the window the limit applies over (s, 1-1800).
    """

    type: str          # "Pods" or "Percent"
    value: int         # > 0
    period_s: int      # (0, 1800]


@dataclass(frozen=True)
class ScalingRules:
    """``behavior.scaleUp`` or ``behavior.scaleDown``.

    Parameters
    ----------
    stabilization_window_s : int
        ``stabilizationWindowSeconds``: the HPA acts on the most conservative recommendation of
        this window (s, 0-3600; defaults 0 up, 300 down).
    select_policy : str
        ``selectPolicy``: ``"Max"`` (the policy allowing the largest change, the default), ``"Min"``
        (the smallest) or ``"Disabled"`` (no scaling in this direction).
    policies : tuple of ScalingPolicy
        ``policies``: the limits on one change (the defaults' when the file lists none).
    """

    stabilization_window_s: int
    select_policy: str                      # "Max", "Min" or "Disabled"
    policies: tuple[ScalingPolicy, ...]


DEFAULT_SCALE_UP = ScalingRules(0, "Max", (ScalingPolicy("Percent", 100, 15), ScalingPolicy("Pods", 4, 15)))
DEFAULT_SCALE_DOWN = ScalingRules(300, "Max", (ScalingPolicy("Percent", 100, 15),))


@dataclass(frozen=True)
class MetricTarget:
    """One entry of ``spec.metrics``: a named metric and its target.

    Parameters
    ----------
    source : str
        The metric source ``type``: ``"Pods"``, ``"Object"`` or ``"External"``.
    metric : str
        ``metric.name``: an engine metric of :data:`~tokenfactory.controllers.formats.common.ENGINE_METRICS`.
    target_type : str
        ``target.type``: ``"AverageValue"`` (per replica) or ``"Value"`` (the metric's total).
    value : float
        ``target.averageValue`` or ``target.value``: the target, in the metric's unit (> 0).
    """

    source: str        # "Pods", "Object" or "External"
    metric: str        # the metric's name
    target_type: str   # "AverageValue" or "Value"
    value: float


@dataclass(frozen=True)
class HPASetting:
    """An HPA object (and the controller-manager settings it runs under), as read.

    Every field is a value of the file, defaults filled in; :meth:`to_documents` writes them all,
    so reading what it writes gives an equal setting.

    Parameters
    ----------
    name : str
        ``metadata.name`` of the HPA object.
    target_kind, target_name : str
        ``spec.scaleTargetRef.kind`` and ``.name``: the workload it scales (e.g. a ``Deployment``).
    max_replicas : int
        ``spec.maxReplicas`` (>= max(1, min_replicas)).
    metrics : tuple of MetricTarget
        ``spec.metrics``: the metrics and their targets (at least one).
    min_replicas : int
        ``spec.minReplicas`` (>= 0; default 1).
    namespace : str, optional
        ``metadata.namespace`` (default None: not written).
    target_api_version : str
        ``spec.scaleTargetRef.apiVersion`` (default ``"apps/v1"``).
    scale_up, scale_down : ScalingRules
        ``spec.behavior.scaleUp`` and ``.scaleDown`` (defaults :data:`DEFAULT_SCALE_UP` and
        :data:`DEFAULT_SCALE_DOWN`).
    sync_period_s : float
        The controller-manager's ``horizontalPodAutoscalerSyncPeriod`` (s, 1-3600; default 15).
    tolerance : float
        The controller-manager's ``horizontalPodAutoscalerTolerance``: no change while
        |metric / target - 1| is at most this ([0, 1]; default 0.1).
    """

    name: str
    target_kind: str
    target_name: str
    max_replicas: int
    metrics: tuple[MetricTarget, ...]
    min_replicas: int = 1
    namespace: str | None = None
    target_api_version: str = "apps/v1"
    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN
    sync_period_s: float = 15.0
    tolerance: float = 0.1
    format: str = field(default="kubernetes-hpa", init=False)

    # ---- writing ----------------------------------------------------------------------------
    def to_documents(self) -> list[dict]:
        """The HPA object and, when they differ from the defaults, the controller-manager
        settings, as YAML-ready mappings."""
        meta: dict[str, Any] = {"name": self.name}
        if self.namespace is not None:
            meta["namespace"] = self.namespace
        spec: dict[str, Any] = {
            "scaleTargetRef": {"apiVersion": self.target_api_version, "kind": self.target_kind,
                               "name": self.target_name},
            "minReplicas": self.min_replicas,
            "maxReplicas": self.max_replicas,
            "metrics": [_metric_doc(m) for m in self.metrics],
            "behavior": {"scaleUp": scaling_rules_doc(self.scale_up), "scaleDown": scaling_rules_doc(self.scale_down)},
        }
        docs = [{"apiVersion": API_VERSION, "kind": "HorizontalPodAutoscaler", "metadata": meta, "spec": spec}]
        if (self.sync_period_s, self.tolerance) != (15.0, 0.1):
            docs.append({"apiVersion": CONTROLLER_MANAGER_API, "kind": CONTROLLER_MANAGER_KIND,
                         "horizontalPodAutoscalerConfig": {
                             "horizontalPodAutoscalerSyncPeriod": format_duration(self.sync_period_s),
                             "horizontalPodAutoscalerTolerance": self.tolerance}})
        return docs

    # ---- the model --------------------------------------------------------------------------
    def controller_params(self) -> dict:
        """Keyword arguments of :class:`tokenfactory.controllers.autoscaling.HorizontalPodAutoscaler`
        that reproduce this setting exactly; :class:`NotModelled` for what the model lacks."""
        if len(self.metrics) != 1:
            raise NotModelled("spec.metrics", f"{len(self.metrics)} metrics (HPA takes the largest recommendation "
                              "over them); the model scales on one")
        m = self.metrics[0]
        em = engine_metric("spec.metrics[0].metric.name", m.metric)
        if m.target_type == "Value" or not em.per_replica:
            raise NotModelled("spec.metrics[0].target.type", f"{m.target_type} on {m.metric!r}: the model compares "
                              "a per-replica average (AverageValue) with the target")
        up, down = self.scale_up, self.scale_down
        params: dict[str, Any] = {"target": m.value, "metric": em.signal, "min_replicas": self.min_replicas,
                                  "max_replicas": self.max_replicas, "tolerance": self.tolerance,
                                  "downscale_stabilization_s": float(down.stabilization_window_s),
                                  "upscale_stabilization_s": float(up.stabilization_window_s),
                                  "sample_period": self.sync_period_s,
                                  # every policy with its own period; the select rule per direction
                                  "scale_up_policies": tuple((p.type.lower(), p.value, float(p.period_s))
                                                             for p in up.policies),
                                  "scale_down_policies": tuple((p.type.lower(), p.value, float(p.period_s))
                                                               for p in down.policies),
                                  "scale_up_select": up.select_policy.lower(),
                                  "scale_down_select": down.select_policy.lower()}
        # the default-policy knobs the HPA also reports: the largest pods / percent policy of a direction
        params["scale_up_pods"] = max((p.value for p in up.policies if p.type == "Pods"), default=0)
        params["scale_up_percent"] = float(max((p.value for p in up.policies if p.type == "Percent"), default=0))
        params["scale_down_percent"] = float(min(100, max((p.value for p in down.policies if p.type == "Percent"),
                                                          default=0)))
        return params

    def build(self, pool: str):
        """The :class:`HorizontalPodAutoscaler` this setting runs, sizing ``pool``."""
        from tokenfactory.controllers.autoscaling import HorizontalPodAutoscaler, HPASpec

        return HorizontalPodAutoscaler(pool, spec=HPASpec(**self.controller_params()))

    def with_params(self, **changes) -> HPASetting:
        """This setting with knobs changed by the model's names (``tolerance``,
        ``downscale_stabilization_s``, ``sample_period``, ``target``, ``min_replicas``, ``max_replicas``)."""
        new = self
        for key, value in changes.items():
            if key == "target":
                new = replace(new, metrics=(replace(new.metrics[0], value=float(value)),) + new.metrics[1:])
            elif key == "downscale_stabilization_s":
                new = replace(new, scale_down=replace(new.scale_down, stabilization_window_s=int(value)))
            elif key == "sample_period":   # the controller-manager's sync; the policies keep their periods
                new = replace(new, sync_period_s=float(value))
            elif key in ("tolerance", "min_replicas", "max_replicas"):
                new = replace(new, **{key: value})
            else:
                raise ConfigError(f"hpa.{key}", "not a knob of this setting; knobs: target, tolerance, "
                                  "downscale_stabilization_s, sample_period, min_replicas, max_replicas")
        return new


def _metric_doc(m: MetricTarget) -> dict:
    key = {"Pods": "pods", "Object": "object", "External": "external"}[m.source]
    target = {"type": m.target_type, ("averageValue" if m.target_type == "AverageValue" else "value"):
              format_quantity(m.value)}
    return {"type": m.source, key: {"metric": {"name": m.metric}, "target": target}}


def scaling_rules_doc(r: ScalingRules) -> dict:
    """The ``behavior.scaleUp`` or ``behavior.scaleDown`` mapping of ``r``, every field explicit.

    Parameters
    ----------
    r : ScalingRules
        The rules to write.
    """
    return {"stabilizationWindowSeconds": r.stabilization_window_s, "selectPolicy": r.select_policy,
            "policies": [{"type": p.type, "value": p.value, "periodSeconds": p.period_s} for p in r.policies]}


# ---- reading --------------------------------------------------------------------------------

def read_scaling_rules(sec: Section, default: ScalingRules, default_window_s: int) -> ScalingRules:
    """The :class:`ScalingRules` of a ``behavior.scaleUp`` or ``behavior.scaleDown`` section.

    Parameters
    ----------
    sec : Section
        The section as read (empty when the file has none); closed on return.
    default : ScalingRules
        The direction's defaults: their policies apply when the section lists none.
    default_window_s : int
        Stabilization window when the section sets none (s, >= 0; 0 up, 300 or the
        controller-manager's window down).

    Raises
    ------
    ConfigError
        For a value out of range or an unknown field; :class:`NotModelled` for a per-direction
        ``tolerance``.
    """
    if not sec.mapping:
        sec.close()
        return replace(default, stabilization_window_s=default_window_s)
    window = sec.get("stabilizationWindowSeconds", default_window_s,
                     lambda f, v: check_int(f, v, low=0, high=3600))
    select = sec.get("selectPolicy", "Max", lambda f, v: check_choice(f, v, ("Max", "Min", "Disabled")))
    if sec.get("tolerance", None) is not None:
        raise NotModelled(sec.path("tolerance"), "per-direction tolerance (alpha HPAConfigurableTolerance); set "
                          "the controller-manager tolerance instead")
    policies = []
    for p in sec.sections("policies"):
        policies.append(ScalingPolicy(p.get("type", parse=lambda f, v: check_choice(f, v, ("Pods", "Percent"))),
                                      p.get("value", parse=lambda f, v: check_int(f, v, low=1)),
                                      p.get("periodSeconds", parse=lambda f, v: check_int(f, v, low=1, high=1800))))
        p.close()
    sec.close()
    return ScalingRules(window, select, tuple(policies) if policies else default.policies)


def _read_metric(sec: Section) -> MetricTarget:
    kind = sec.get("type", parse=lambda f, v: check_choice(f, v, ("Pods", "Object", "External", "Resource",
                                                                    "ContainerResource")))
    if kind in ("Resource", "ContainerResource"):
        raise NotModelled(sec.path("type"), f"{kind} (CPU/memory) metrics: the plant has no CPU or memory "
                          "utilisation; scale on an engine metric (Pods or External)")
    body = sec.section(kind[0].lower() + kind[1:])
    metric = body.section("metric")
    name = metric.get("name", parse=parse_name)
    if metric.get("selector", None) is not None:
        raise NotModelled(metric.path("selector"), "label selectors (the plant has one series per metric)")
    metric.close()
    if kind == "Object":
        body.ignore("describedObject")
    target = body.section("target")
    ttype = target.get("type", parse=lambda f, v: check_choice(f, v, ("AverageValue", "Value", "Utilization")))
    if ttype == "Utilization":
        raise NotModelled(target.path("type"), "Utilization targets apply to Resource metrics only")
    value = target.get("averageValue" if ttype == "AverageValue" else "value", parse=parse_quantity)
    target.close()
    body.close()
    sec.close()
    engine_metric(f"{sec.where}.{kind[0].lower() + kind[1:]}.metric.name", name)
    return MetricTarget(kind, name, ttype, value)


def _read_controller_manager(doc: dict, where: str) -> tuple[float, float, int | None]:
    top = Section(doc, where)
    top.ignore("apiVersion", "kind")
    cfg = top.section("horizontalPodAutoscalerConfig")
    sync = cfg.get("horizontalPodAutoscalerSyncPeriod", 15.0,
                   lambda f, v: parse_duration_s(f, v, low=1.0, high=3600.0))
    tol = cfg.get("horizontalPodAutoscalerTolerance", 0.1, lambda f, v: parse_number_string(f, v, low=0.0, high=1.0))
    window = cfg.get("horizontalPodAutoscalerDownscaleStabilizationWindow", None,
                     lambda f, v: int(parse_duration_s(f, v, low=0.0, high=3600.0)))
    for key in ("horizontalPodAutoscalerCPUInitializationPeriod", "horizontalPodAutoscalerInitialReadinessDelay",
                "concurrentHorizontalPodAutoscalerSyncs"):
        cfg.ignore(key)   # CPU-metric and worker-count settings: no effect on engine-metric scaling
    cfg.close()
    top.close()
    return sync, tol, window


def read_hpa(docs: list[dict], where: str = "hpa") -> HPASetting:
    """The :class:`HPASetting` of an HPA document (plus an optional controller-manager document).

    Parameters
    ----------
    docs : list of dict
        The file's parsed YAML documents: one ``HorizontalPodAutoscaler`` and at most one
        ``KubeControllerManagerConfiguration``.
    where : str
        Name of the file or object, the root of every error's path (default ``"hpa"``).

    Raises
    ------
    ConfigError
        For a missing required field, a value out of range, or an unknown field (named by its
        path); :class:`NotModelled` for a valid field tokenfactory does not model.
    """
    hpas = [d for d in docs if d.get("kind") == "HorizontalPodAutoscaler"]
    cms = [d for d in docs if d.get("kind") == CONTROLLER_MANAGER_KIND]
    others = [d.get("kind") for d in docs if d.get("kind") not in ("HorizontalPodAutoscaler", CONTROLLER_MANAGER_KIND)]
    if len(hpas) != 1 or len(cms) > 1 or others:
        raise ConfigError(where, f"expected one HorizontalPodAutoscaler (and at most one {CONTROLLER_MANAGER_KIND}); "
                          f"found kinds {[d.get('kind') for d in docs]}")
    sync, tol, cm_window = (15.0, 0.1, None) if not cms else _read_controller_manager(cms[0], f"{where}[controller-manager]")
    top = Section(hpas[0], where)
    api = top.get("apiVersion", parse=lambda f, v: check_choice(f, v, (API_VERSION,)))
    top.ignore("kind", "status")
    del api
    name, namespace = read_object_name(top)
    spec = top.section("spec")
    target_api, target_kind, target_name = read_target_ref(spec)
    min_r = spec.get("minReplicas", 1, lambda f, v: check_int(f, v, low=0))
    max_r = spec.get("maxReplicas", parse=lambda f, v: check_int(f, v, low=max(1, min_r)))
    metrics = tuple(_read_metric(m) for m in spec.sections("metrics"))
    if not metrics:
        raise NotModelled(spec.path("metrics"), "no metrics means 80 % average CPU; the plant has no CPU - "
                          "scale on an engine metric")
    behavior = spec.section("behavior")
    down_default = cm_window if cm_window is not None else 300
    up = read_scaling_rules(behavior.section("scaleUp"), DEFAULT_SCALE_UP, 0)
    down = read_scaling_rules(behavior.section("scaleDown"), DEFAULT_SCALE_DOWN, down_default)
    behavior.close()
    spec.close()
    top.close()
    return HPASetting(name=name, target_kind=target_kind, target_name=target_name, max_replicas=max_r,
                      metrics=metrics, min_replicas=min_r, namespace=namespace, target_api_version=target_api,
                      scale_up=up, scale_down=down, sync_period_s=sync, tolerance=tol)
