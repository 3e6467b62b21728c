"""KEDA ``ScaledObject`` (``keda.sh/v1alpha1``) settings: read, write, build.

Fields and defaults from KEDA's ScaledObject specification (keda.sh/docs, "ScaledObject
specification"): ``pollingInterval`` 30 s, ``cooldownPeriod`` 300 s, ``initialCooldownPeriod`` 0,
``minReplicaCount`` 0, ``maxReplicaCount`` 100; a trigger's ``metricType`` defaults to
``AverageValue``. KEDA scales 1 <-> N through an HPA it creates (``advanced.horizontalPodAutoscalerConfig``
passes ``behavior`` through), which syncs at the controller-manager's period; ``pollingInterval``
and ``cooldownPeriod`` govern only activation (0 <-> 1) - so the loop model is the HPA's, with
KEDA's trigger threshold as the target.

Only ``prometheus`` triggers on an engine metric are modelled: the query must aggregate one
metric of :data:`tokenfactory.controllers.formats.common.ENGINE_METRICS` - ``sum(...)`` with
``AverageValue`` (the HPA divides by the replicas) or ``avg(...)`` with ``Value``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from tokenfactory.controllers.formats.common import (
    ENGINE_METRICS,
    NotModelled,
    Section,
    format_quantity,
    parse_name,
    parse_quantity,
    read_object_name,
    read_target_ref,
)
from tokenfactory.controllers.formats.kubernetes_hpa import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    HPASetting,
    MetricTarget,
    ScalingRules,
    read_scaling_rules,
    scaling_rules_doc,
)
from tokenfactory.core.errors import ConfigError
from tokenfactory.core.validation import check_choice, check_int

__all__ = ["PrometheusTrigger", "KEDASetting", "read_keda"]

API_VERSION = "keda.sh/v1alpha1"


@dataclass(frozen=True)
class PrometheusTrigger:
    """A ``prometheus`` trigger: the query, its threshold and how the HPA reads it.

    Parameters
    ----------
    server_address : str
        ``metadata.serverAddress``: the Prometheus server's URL.
    query : str
        ``metadata.query``: PromQL; modelled when it is ``sum(M)`` or ``avg(M)`` of one engine metric M.
    threshold : float
        ``metadata.threshold``: the target the HPA compares the query with (a quantity > 0, in M's unit).
    metric_type : str
        ``metricType``: ``"AverageValue"`` (default; the HPA divides the query by the replicas) or ``"Value"``.
    activation_threshold : float
        ``metadata.activationThreshold``: the query value above which KEDA activates the
        workload, 0 -> 1 (default 0).
    name : str, optional
        The trigger's ``name`` (default None: not written).
    """

    server_address: str
    query: str
    threshold: float
    metric_type: str = "AverageValue"      # or "Value"
    activation_threshold: float = 0.0
    name: str | None = None

    def engine_metric(self, where: str) -> tuple[str, str]:
        """(engine metric name, aggregation) of the query, or :class:`NotModelled`."""
        m = re.fullmatch(r"\s*(sum|avg)\s*\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^}]*\})?\s*\)\s*", self.query)
        if not m or m.group(2) not in ENGINE_METRICS:
            raise NotModelled(f"{where}.metadata.query", f"{self.query!r}: the model reads sum(M) or avg(M) of one "
                              "engine metric M among " + ", ".join(sorted(ENGINE_METRICS)))
        return m.group(2), m.group(1)


@dataclass(frozen=True)
class KEDASetting:
    """A ScaledObject, as read; defaults filled in, so writing and reading back is exact.

    Parameters
    ----------
    name : str
        ``metadata.name`` of the ScaledObject.
    target_name : str
        ``spec.scaleTargetRef.name``: the workload it scales.
    triggers : tuple of PrometheusTrigger
        ``spec.triggers`` (at least one; the model scales on exactly one).
    namespace : str, optional
        ``metadata.namespace`` (default None: not written).
    target_kind : str
        ``spec.scaleTargetRef.kind`` (default ``"Deployment"``).
    target_api_version : str
        ``spec.scaleTargetRef.apiVersion`` (default ``"apps/v1"``).
    polling_interval_s : int
        ``spec.pollingInterval``: how often KEDA checks the triggers for activation (s, >= 1; default 30).
    cooldown_period_s : int
        ``spec.cooldownPeriod``: wait after the last active trigger before scaling to 0 (s, >= 0; default 300).
    initial_cooldown_period_s : int
        ``spec.initialCooldownPeriod``: wait after creation before the cooldown applies (s, >= 0; default 0).
    min_replicas : int
        ``spec.minReplicaCount`` (>= 0; default 0, KEDA's scale to zero).
    max_replicas : int
        ``spec.maxReplicaCount`` (>= max(1, min_replicas); default 100).
    scale_up, scale_down : ScalingRules
        ``spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleUp`` and ``.scaleDown``, passed
        to the HPA KEDA creates (defaults the HPA's).
    """

    name: str
    target_name: str
    triggers: tuple[PrometheusTrigger, ...]
    namespace: str | None = None
    target_kind: str = "Deployment"
    target_api_version: str = "apps/v1"
    polling_interval_s: int = 30
    cooldown_period_s: int = 300
    initial_cooldown_period_s: int = 0
    min_replicas: int = 0
    max_replicas: int = 100
    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN
    format: str = field(default="keda", init=False)

    def to_documents(self) -> list[dict]:
        meta: dict[str, Any] = {"name": self.name}
        if self.namespace is not None:
            meta["namespace"] = self.namespace
        triggers = []
        for t in self.triggers:
            doc: dict[str, Any] = {"type": "prometheus", "metricType": t.metric_type,
                                   "metadata": {"serverAddress": t.server_address, "query": t.query,
                                                "threshold": format_quantity(t.threshold),
                                                "activationThreshold": format_quantity(t.activation_threshold)}}
            if t.name is not None:
                doc["name"] = t.name
            triggers.append(doc)
        spec = {"scaleTargetRef": {"apiVersion": self.target_api_version, "kind": self.target_kind,
                                   "name": self.target_name},
                "pollingInterval": self.polling_interval_s, "cooldownPeriod": self.cooldown_period_s,
                "initialCooldownPeriod": self.initial_cooldown_period_s,
                "minReplicaCount": self.min_replicas, "maxReplicaCount": self.max_replicas,
                "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                    "scaleUp": scaling_rules_doc(self.scale_up), "scaleDown": scaling_rules_doc(self.scale_down)}}},
                "triggers": triggers}
        return [{"apiVersion": API_VERSION, "kind": "ScaledObject", "metadata": meta, "spec": spec}]

    def as_hpa(self) -> HPASetting:
        """The HPA KEDA creates for this ScaledObject (what decides once a replica is active)."""
        if len(self.triggers) != 1:
            raise NotModelled("spec.triggers", f"{len(self.triggers)} triggers; the model scales on one")
        t = self.triggers[0]
        metric, agg = t.engine_metric("spec.triggers[0]")
        if (agg, t.metric_type) not in (("sum", "AverageValue"), ("avg", "Value")):
            raise NotModelled("spec.triggers[0].metricType", f"{t.metric_type} on {agg}(...): use sum(...) with "
                              "AverageValue or avg(...) with Value (a per-replica average against the threshold)")
        return HPASetting(name=self.name, target_kind=self.target_kind, target_name=self.target_name,
                          max_replicas=self.max_replicas,
                          metrics=(MetricTarget("External", metric, "AverageValue", t.threshold),),
                          min_replicas=max(1, self.min_replicas), namespace=self.namespace,
                          target_api_version=self.target_api_version, scale_up=self.scale_up,
                          scale_down=self.scale_down)

    def controller_params(self) -> dict:
        """The HPA's parameters (a ``minReplicaCount`` of 0 is KEDA's activation path: the plant
        keeps one worker serving, so the HPA's floor is 1)."""
        return self.as_hpa().controller_params()

    def build(self, pool: str):
        return self.as_hpa().build(pool)

    def with_params(self, **changes) -> KEDASetting:
        """Knobs by the model's names: ``target`` (the trigger threshold), ``downscale_stabilization_s``,
        ``min_replicas``, ``max_replicas``."""
        new = self
        for key, value in changes.items():
            if key == "target":
                new = replace(new, triggers=(replace(new.triggers[0], threshold=float(value)),) + new.triggers[1:])
            elif key == "downscale_stabilization_s":
                new = replace(new, scale_down=replace(new.scale_down, stabilization_window_s=int(value)))
            elif key in ("min_replicas", "max_replicas"):
                new = replace(new, **{key: int(value)})
            else:
                raise ConfigError(f"keda.{key}", "not a knob of this setting; knobs: target, "
                                  "downscale_stabilization_s, min_replicas, max_replicas")
        return new


def _read_trigger(sec: Section) -> PrometheusTrigger:
    kind = sec.get("type", parse=parse_name)
    if kind != "prometheus":
        raise NotModelled(sec.path("type"), f"trigger type {kind!r}; the model reads prometheus triggers on engine "
                          "metrics")
    mtype = sec.get("metricType", "AverageValue", lambda f, v: check_choice(f, v, ("AverageValue", "Value",
                                                                                   "Utilization")))
    if mtype == "Utilization":
        raise NotModelled(sec.path("metricType"), "Utilization applies to cpu/memory triggers only")
    name = sec.get("name", None)
    sec.ignore("authenticationRef", "useCachedMetrics")
    md = sec.section("metadata")
    address = md.get("serverAddress", parse=parse_name)
    query = md.get("query", parse=parse_name)
    threshold = md.get("threshold", parse=parse_quantity)
    activation = md.get("activationThreshold", 0.0, lambda f, v: parse_quantity(f, v, positive=False))
    md.ignore("namespace", "customHeaders", "ignoreNullValues", "unsafeSsl", "authModes", "queryParameters")
    md.close()
    sec.close()
    trig = PrometheusTrigger(address, query, threshold, mtype, activation, name)
    trig.engine_metric(sec.where)
    return trig


def read_keda(docs: list[dict], where: str = "keda") -> KEDASetting:
    """The :class:`KEDASetting` of one ScaledObject document.

    Parameters
    ----------
    docs : list of dict
        The file's parsed YAML documents: exactly one ``ScaledObject``.
    where : str
        Name of the file or object, the root of every error's path (default ``"keda"``).

    Raises
    ------
    ConfigError
        For a missing required field, a value out of range, or an unknown field (named by its
        path); :class:`NotModelled` for a valid field tokenfactory does not model.
    """
    if len(docs) != 1 or docs[0].get("kind") != "ScaledObject":
        raise ConfigError(where, f"expected one ScaledObject document; found kinds {[d.get('kind') for d in docs]}")
    top = Section(docs[0], where)
    top.get("apiVersion", parse=lambda f, v: check_choice(f, v, (API_VERSION,)))
    top.ignore("kind", "status")
    name, namespace = read_object_name(top)
    spec = top.section("spec")
    api, kind, target = read_target_ref(spec, default_kind="Deployment", kept=("envSourceContainerName",))
    polling = spec.get("pollingInterval", 30, lambda f, v: check_int(f, v, low=1))
    cooldown = spec.get("cooldownPeriod", 300, lambda f, v: check_int(f, v, low=0))
    initial = spec.get("initialCooldownPeriod", 0, lambda f, v: check_int(f, v, low=0))
    if spec.get("idleReplicaCount", None) is not None:
        raise NotModelled(spec.path("idleReplicaCount"), "idle replicas (scale to an idle count between 0 and min)")
    min_r = spec.get("minReplicaCount", 0, lambda f, v: check_int(f, v, low=0))
    max_r = spec.get("maxReplicaCount", 100, lambda f, v: check_int(f, v, low=max(1, min_r)))
    if spec.get("fallback", None) is not None:
        raise NotModelled(spec.path("fallback"), "fallback replicas on scaler errors (the plant's metrics never fail)")
    adv = spec.section("advanced")
    adv.ignore("restoreToOriginalReplicaCount")
    if adv.get("scalingModifiers", None) is not None:
        raise NotModelled(adv.path("scalingModifiers"), "composite scaling formulas")
    hpa_cfg = adv.section("horizontalPodAutoscalerConfig")
    hpa_cfg.ignore("name")
    behavior = hpa_cfg.section("behavior")
    up = read_scaling_rules(behavior.section("scaleUp"), DEFAULT_SCALE_UP, 0)
    down = read_scaling_rules(behavior.section("scaleDown"), DEFAULT_SCALE_DOWN, 300)
    behavior.close()
    hpa_cfg.close()
    adv.close()
    triggers = tuple(_read_trigger(t) for t in spec.sections("triggers"))
    if not triggers:
        raise ConfigError(spec.path("triggers"), "a ScaledObject needs at least one trigger")
    spec.close()
    top.close()
    return KEDASetting(name=name, target_name=target, triggers=triggers, namespace=namespace, target_kind=kind,
                       target_api_version=api, polling_interval_s=polling, cooldown_period_s=cooldown,
                       initial_cooldown_period_s=initial, min_replicas=min_r, max_replicas=max_r,
                       scale_up=up, scale_down=down)
