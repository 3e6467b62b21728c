"""NVIDIA Dynamo planner settings (the ``PlannerConfig`` file ``python -m dynamo.planner --config``
reads): read, write, build the real planner.

The fields, types, defaults and ranges are those of ``ai-dynamo`` 1.4.2
(``dynamo/planner/config/planner_config.py``: ``PlannerConfig`` and ``SchedulingConfig``; the
defaults from ``dynamo/planner/config/defaults.py``, ``SLAPlannerDefaults``);
``tests/test_formats_dynamo_planner_config.py`` checks this table against the installed package. Dynamo's
own model ignores a key it does not know (pydantic's default ``extra = "ignore"``); here an unknown
key is an error naming its path. Aliases Dynamo accepts (``ttft``, ``itl``,
``load_adjustment_interval``, ``throughput_adjustment_interval``) are read and written under the
field's own name; an unwritten ``scheduling.scale_interval_seconds`` stays unwritten (Dynamo derives
it from the adjustment intervals, :meth:`DynamoPlannerSetting.scale_interval_s`).

Each field is one of three things:

* **decides** - passed unchanged to the real planner (:class:`~tokenfactory.controllers.dynamo_planner.DynamoPlanner`,
  which runs Dynamo's code): targets, thresholds, intervals, predictors, budgets, SLO;
* **kept** - deployment plumbing with no effect on a decision in the simulated loop (Prometheus
  endpoints, reports, dashboard, namespace, log and profile directories): kept as written, and
  the adapter runs the planner without servers or reports;
* **not modelled** - a valid value the adapter cannot honour, rejected with :class:`NotModelled`
  saying why (aggregated or single-pool modes, the global planner, AIC sweeps, external plugins,
  a warm-up trace file, the multi-bucket FPM retention of ``sla`` mode, which is not reproducible
  in 1.4.2).

Cross-field rules (load thresholds present and ordered, intervals dividing, load faster than
throughput scaling) are Dynamo's own: the reader runs ``PlannerConfig``'s validation when the
``dynamo`` extra is installed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from tokenfactory.controllers.formats.common import NotModelled, Section
from tokenfactory.core.errors import ConfigError
from tokenfactory.core.validation import check_choice, check_int, check_number

__all__ = ["DynamoPlannerSetting", "read_dynamo_planner", "PLANNER_FIELDS", "SCHEDULING_FIELDS", "PLANNER_ALIASES",
           "looks_like_planner_config"]

_INF = math.inf

#: PlannerConfig's top-level fields (ai-dynamo 1.4.2): name -> (type, default, role, allowed).
#: type: int, float, bool, str, or a tuple of choices; "?" prefix: None allowed. role: "decides",
#: "kept", or "env" (kept; default None = Dynamo reads it from the environment). allowed: (low,
#: high) for numbers.
PLANNER_FIELDS: dict[str, tuple[Any, Any, str, tuple]] = {
    "pre_deployment_sweeping_mode": (("none", "rapid", "thorough", None), "rapid", "kept", ()),
    "environment": (("kubernetes", "virtual", "global-planner"), "kubernetes", "kept", ()),
    "namespace": ("?str", None, "env", ()),
    "backend": (("vllm", "sglang", "trtllm", "mocker"), "vllm", "kept", ()),
    "mode": (("disagg", "prefill", "decode", "agg"), "disagg", "decides", ()),
    "optimization_target": (("throughput", "latency", "load", "sla"), "throughput", "decides", ()),
    "log_dir": ("?str", None, "kept", ()),
    "throughput_adjustment_interval_seconds": ("int", 180, "decides", (-_INF, _INF)),
    "max_gpu_budget": ("int", 8, "decides", (-_INF, _INF)),
    "min_gpu_budget": ("int", -1, "decides", (-_INF, _INF)),
    "min_endpoint": ("int", 1, "decides", (-_INF, _INF)),
    "decode_engine_num_gpu": ("?int", None, "decides", (-_INF, _INF)),
    "prefill_engine_num_gpu": ("?int", None, "decides", (-_INF, _INF)),
    "profile_results_dir": ("str", "profiling_results", "kept", ()),
    "aic_interpolation": ("?any", None, "decides", ()),
    "aic_perf_model": ("?any", None, "decides", ()),
    "ttft_ms": ("float", 500.0, "decides", (-_INF, _INF)),
    "itl_ms": ("float", 50.0, "decides", (-_INF, _INF)),
    "load_predictor": (("constant", "arima", "kalman", "prophet"), "arima", "decides", ()),
    "load_predictor_log1p": ("bool", False, "decides", ()),
    "prophet_window_size": ("int", 50, "decides", (-_INF, _INF)),
    "load_predictor_warmup_trace": ("?str", None, "decides", ()),
    "kalman_q_level": ("float", 1.0, "decides", (-_INF, _INF)),
    "kalman_q_trend": ("float", 0.1, "decides", (-_INF, _INF)),
    "kalman_r": ("float", 10.0, "decides", (-_INF, _INF)),
    "kalman_min_points": ("int", 5, "decides", (-_INF, _INF)),
    "metric_pulling_prometheus_endpoint": ("?str", None, "env", ()),
    "metric_pulling_prometheus_token": ("?str", None, "env", ()),
    "metric_pulling_prometheus_token_file": ("?str", None, "env", ()),
    "metric_pulling_prometheus_ssl_verify": ("?bool", None, "env", ()),
    "metric_pulling_prometheus_extra_query_params": ("?any", None, "env", ()),
    "metric_pulling_prometheus_ca_bundle": ("?str", None, "env", ()),
    "metric_reporting_prometheus_port": ("?int", None, "env", (0, 65535)),
    "throughput_metrics_source": (("frontend", "router"), "frontend", "kept", ()),
    "model_name": ("?str", None, "kept", ()),
    "global_planner_namespace": ("?str", None, "kept", ()),
    "enable_throughput_scaling": ("bool", True, "decides", ()),
    "enable_load_scaling": ("bool", False, "decides", ()),
    "load_adjustment_interval_seconds": ("int", 5, "decides", (1, _INF)),
    "max_num_fpm_samples": ("int", 64, "decides", (-_INF, _INF)),
    "fpm_sample_bucket_size": ("int", 16, "decides", (-_INF, _INF)),
    "load_scaling_down_sensitivity": ("int", 80, "decides", (-_INF, _INF)),
    "prefill_scale_up_queue_tokens": ("?int", None, "decides", (0, _INF)),
    "prefill_scale_down_queue_tokens": ("?int", None, "decides", (0, _INF)),
    "decode_scale_up_kv_rate": ("?float", None, "decides", (0.0, 100.0)),
    "decode_scale_down_kv_rate": ("?float", None, "decides", (0.0, 100.0)),
    "load_min_observations": ("int", 5, "decides", (-_INF, _INF)),
    "speculative_nextn": ("int", 0, "decides", (0, _INF)),
    "advisory": ("bool", False, "decides", ()),
    "report_interval_hours": ("?float", 24.0, "kept", (0.0, _INF)),
    "report_output_dir": ("str", "./planner_reports", "kept", ()),
    "report_filename": ("?str", None, "kept", ()),
    "report_write_gzip_log": ("bool", True, "kept", ()),
    "live_dashboard_port": ("int", 8080, "kept", (0, 65535)),
    "scheduling": ("section", None, "decides", ()),
    "plugin_registration": ("?any", None, "decides", ()),
}
#: SchedulingConfig (extra = "forbid" in Dynamo too): name -> (type, default, role, allowed);
#: ``scale_interval_seconds`` None = not written: Dynamo's rule (the gcd of the adjustment intervals)
SCHEDULING_FIELDS: dict[str, tuple[Any, Any, str, tuple]] = {
    "tick_max_duration_seconds": ("float", 30.0, "kept", (0.0, _INF)),
    "external_plugins": ("?any", None, "decides", ()),
    "gateway": ("?any", None, "kept", ()),
    "scale_interval_seconds": ("?float", None, "decides", (0.0, _INF)),
}
#: Dynamo's validation aliases -> the field
PLANNER_ALIASES = {"ttft": "ttft_ms", "itl": "itl_ms", "load_adjustment_interval": "load_adjustment_interval_seconds",
                   "throughput_adjustment_interval": "throughput_adjustment_interval_seconds"}
#: fields the adapter owns (the simulated deployment: no servers, no reports, disaggregated)
_ADAPTER_OWNS = ("environment", "report_interval_hours", "live_dashboard_port", "metric_reporting_prometheus_port",
                 "report_write_gzip_log", "pre_deployment_sweeping_mode")
_EXCLUSIVE_LOW = {"load_adjustment_interval_seconds", "report_interval_hours", "tick_max_duration_seconds",
                  "scale_interval_seconds"}


def looks_like_planner_config(doc: dict) -> bool:
    """Whether a document without ``kind`` reads as a planner config: at least half of its keys
    are PlannerConfig fields or aliases (so a misspelt key is named by the strict reader).

    Parameters
    ----------
    doc : dict
        A YAML/JSON document's top-level mapping.

    Returns
    -------
    bool
    """
    keys = [str(k) for k in doc]
    known = sum(1 for k in keys if k in PLANNER_FIELDS or k in PLANNER_ALIASES)
    return bool(keys) and known * 2 >= len(keys) and known > 0


def _parse(where: str, kind: Any, value: Any, allowed: tuple) -> Any:
    if isinstance(kind, tuple):
        return check_choice(where, value, kind)
    optional = kind.startswith("?")
    kind = kind.lstrip("?")
    if value is None:
        if optional:
            return None
        raise ConfigError(where, "must not be null")
    if kind == "any":
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(where, f"expected true or false, got {value!r}")
        return value
    if kind == "str":
        if not isinstance(value, str):
            raise ConfigError(where, f"expected a string, got {value!r}")
        return value
    low, high = allowed or (-_INF, _INF)
    name = where.rsplit(".", 1)[-1]
    if kind == "int":
        return check_int(where, value, low=None if low == -_INF else int(low), high=None if high == _INF else int(high))
    return float(check_number(where, value, low=None if low == -_INF else low, high=None if high == _INF else high,
                              low_inclusive=name not in _EXCLUSIVE_LOW))


def _frozen(x: Any) -> Any:
    """Nested mappings and lists as tuples (the setting is hashable and compares by value)."""
    if isinstance(x, dict):
        return tuple((str(k), _frozen(v)) for k, v in x.items())
    if isinstance(x, list):
        return ("__list__",) + tuple(_frozen(v) for v in x)
    return x


def _thawed(x: Any) -> Any:
    if isinstance(x, tuple) and x[:1] == ("__list__",):
        return [_thawed(v) for v in x[1:]]
    if isinstance(x, tuple) and all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) for p in x):
        return {k: _thawed(v) for k, v in x}
    return x


@dataclass(frozen=True)
class DynamoPlannerSetting:
    """A Dynamo planner config, as read: every ``PlannerConfig`` field (defaults filled in) and
    the ``scheduling`` section.

    Parameters
    ----------
    values : tuple of (str, value)
        Every field of :data:`PLANNER_FIELDS` but ``scheduling``, in the table's order (nested
        mappings as tuples of pairs).
    scheduling : tuple of (str, value)
        Every field of :data:`SCHEDULING_FIELDS`.
    """

    values: tuple[tuple[str, Any], ...]
    scheduling: tuple[tuple[str, Any], ...]
    format: str = field(default="dynamo-planner", init=False)
    #: field -> the alias a user's file may spell it by (``rewrite_control_plane`` edits it in place)
    field_aliases: ClassVar[dict[str, str]] = {name: alias for alias, name in PLANNER_ALIASES.items()}

    def __getitem__(self, name: str) -> Any:
        if name == "scale_interval_seconds":
            return self.scale_interval_s()
        for k, v in self.values + self.scheduling:
            if k == name:
                return _thawed(v)
        raise KeyError(name)

    def scale_interval_s(self) -> float:
        """The pipeline cadence: ``scheduling.scale_interval_seconds`` as written, else Dynamo's rule
        (``PlannerConfig._default_scale_interval_from_builtin_intervals``): the gcd, in ms, of the
        load and - with sla throughput scaling on - the throughput adjustment intervals."""
        given = dict(self.scheduling)["scale_interval_seconds"]
        if given is not None:
            return float(given)
        d = dict(self.values)
        ivs = [d["load_adjustment_interval_seconds"]]
        if d["enable_throughput_scaling"] and d["optimization_target"] == "sla":
            ivs.append(d["throughput_adjustment_interval_seconds"])
        return math.gcd(*(round(1000 * v) for v in ivs)) / 1000.0

    # ---- writing ----------------------------------------------------------------------------
    def to_documents(self) -> list[dict]:
        """The config as one YAML-ready mapping: every field, but the environment-read ones left
        unset (Dynamo then reads them from the environment as before)."""
        doc: dict[str, Any] = {}
        for k, v in self.values:
            if PLANNER_FIELDS[k][2] == "env" and v is None:
                continue
            doc[k] = _thawed(v)
        sched = {k: _thawed(v) for k, v in self.scheduling if v is not None}
        doc["scheduling"] = sched
        return [doc]

    # ---- the model --------------------------------------------------------------------------
    def planner_fields(self) -> dict:
        """The ``PlannerConfig`` fields the real planner runs with: every deciding field as
        read (the adapter owns the simulated deployment's: environment, reports, servers, and
        bootstraps the profile from the service model); :class:`NotModelled` for a value the
        adapter cannot honour."""
        d = {k: _thawed(v) for k, v in self.values}
        if d["optimization_target"] == "latency":
            raise NotModelled("optimization_target", "'latency' (tighter static thresholds): the adapter sets up "
                              "and is tested with the throughput, load and sla targets")
        if d["mode"] != "disagg":
            raise NotModelled("mode", f"{d['mode']!r}: the adapter runs a disaggregated deployment (a fill and a "
                              "decode pool); aggregated and single-pool planners are not wired")
        if d["environment"] == "global-planner":
            raise NotModelled("environment", "'global-planner' delegates scaling to Dynamo's GlobalPlanner "
                              "(cross-deployment budgets); one deployment's planner is modelled")
        for name, why in (("aic_interpolation", "an AIConfigurator sweep at bootstrap; the adapter seeds the "
                           "perf model from the service model's pass times instead"),
                          ("aic_perf_model", "AIConfigurator's native perf model (not installed); the adapter "
                           "seeds the perf model from the service model's pass times"),
                          ("load_predictor_warmup_trace", "a trace file on the planner's host warms the "
                           "predictor; the simulated planner starts cold"),
                          ("plugin_registration", "plugin registry settings (auth, transport, in-process "
                           "plugins); the simulated planner runs the built-in plugins only")):
            if d[name] not in (None, {}):
                raise NotModelled(name, why)
        sched = {k: _thawed(v) for k, v in self.scheduling}
        if sched["external_plugins"] not in (None, []):
            raise NotModelled("scheduling.external_plugins", "out-of-process gRPC plugins; the simulated planner "
                              "runs the built-in plugins only")
        throughput_on = d["enable_throughput_scaling"] and d["optimization_target"] == "sla"
        if throughput_on and d["fpm_sample_bucket_size"] != 1:
            raise NotModelled("fpm_sample_bucket_size", f"{d['fpm_sample_bucket_size']} buckets: ai-dynamo 1.4.2's "
                              "perf model evicts retained samples across buckets in an order that differs between "
                              "planner instances (5 fresh planners disagreed on 93 % of capacity estimates), so "
                              "decisions are not reproducible; set 1")
        out = {k: v for k, v in d.items() if PLANNER_FIELDS[k][2] == "decides" and v is not None}
        out.pop("plugin_registration", None)
        out.pop("scheduling", None)
        s = {k: v for k, v in sched.items() if v is not None and k in ("scale_interval_seconds",
                                                                          "tick_max_duration_seconds")}
        if s:
            out["scheduling"] = s
        return out

    def validate(self) -> None:
        """Dynamo's own cross-field validation (``PlannerConfig`` 1.4.2) of :meth:`planner_fields`,
        when the ``dynamo`` extra is installed; a violation is a :class:`ConfigError` naming the field."""
        try:
            import dynamo.planner.config.planner_config  # noqa: F401
        except ImportError:
            return
        from tokenfactory.controllers.dynamo_planner import planner_config

        fields = self.planner_fields()
        planner_config(fields["optimization_target"], fields["load_predictor"], overrides=fields)

    def build(self, pool: str | None = None, ctx=None):
        """The real planner (:class:`~tokenfactory.controllers.dynamo_planner.DynamoPlanner`)
        with this config, sizing both pools of the plant ``ctx`` (a
        :class:`tokenfactory.registry.PlantContext`: the engines' capabilities come from its
        service model). ``pool`` is ignored: Dynamo's planner sizes the fill and the decode pool
        together."""
        if ctx is None:
            raise ConfigError("dynamo-planner", "the planner needs the plant's engines (a PlantContext): run it with "
                              "`simulate --control-plane FILE` or `--autoscaler dynamo-planner --planner-config FILE`")
        from tokenfactory.controllers.dynamo_planner import DynamoCapabilities, DynamoPlanner

        fields = self.planner_fields()
        return DynamoPlanner(DynamoCapabilities.from_context(ctx), fields["optimization_target"],
                             fields["load_predictor"], config=fields, slo_ttft_s=ctx.slo_ttft_s,
                             slo_tpot_s=ctx.slo_tpot_s, max_replicas=ctx.max_replicas)

    def registered_autoscaler(self) -> tuple[str, dict]:
        """The registry's autoscaler kind and parameters that run this config on a plant (the kind
        builds the planner from the plant's engines, as :meth:`build` does)."""
        return "dynamo-planner", {"planner_config": self.planner_fields()}

    def with_params(self, **changes) -> DynamoPlannerSetting:
        """This setting with ``PlannerConfig`` fields changed (Dynamo's names; ``scale_interval_seconds``
        and ``tick_max_duration_seconds`` change the scheduling section)."""
        values, sched = dict(self.values), dict(self.scheduling)
        for key, value in changes.items():
            key = PLANNER_ALIASES.get(key, key)
            if key in SCHEDULING_FIELDS:
                kind, _, _, allowed = SCHEDULING_FIELDS[key]
                sched[key] = _frozen(_parse(f"scheduling.{key}", kind, value, allowed))
            elif key in PLANNER_FIELDS and key != "scheduling":
                kind, _, _, allowed = PLANNER_FIELDS[key]
                values[key] = _frozen(_parse(key, kind, value, allowed))
            else:
                raise ConfigError(f"dynamo-planner.{key}", "not a field of Dynamo's PlannerConfig")
        return replace(self, values=tuple(values.items()), scheduling=tuple(sched.items()))


def read_dynamo_planner(docs: list[dict], where: str = "planner") -> DynamoPlannerSetting:
    """The :class:`DynamoPlannerSetting` of a planner config document.

    Parameters
    ----------
    docs : list of dict
        The file's parsed YAML (or JSON) documents: exactly one mapping of PlannerConfig fields.
    where : str
        Name of the file, the root of every error's path (default ``"planner"``).

    Raises
    ------
    ConfigError
        For a value of the wrong type or out of range, an unknown field (named by its path), a
        field given under two names, or a violation of Dynamo's own validation; :class:`NotModelled`
        for a valid value the simulated planner cannot honour (see the module's docstring).
    """
    if len(docs) != 1:
        raise ConfigError(where, f"expected one mapping of PlannerConfig fields, found {len(docs)} documents")
    raw = dict(docs[0])
    for alias, name in PLANNER_ALIASES.items():
        if alias in raw:
            if name in raw:
                raise ConfigError(f"{where}.{alias}", f"given twice: as {alias!r} and as {name!r}")
            raw[name] = raw.pop(alias)
    top = Section(raw, where)
    values = []
    for name, (kind, default, role, allowed) in PLANNER_FIELDS.items():
        if name == "scheduling":
            continue
        values.append((name, _frozen(top.get(name, default, lambda f, v, k=kind, a=allowed: _parse(f, k, v, a)))))
    sec = top.section("scheduling")
    sched = []
    for name, (kind, default, role, allowed) in SCHEDULING_FIELDS.items():
        sched.append((name, _frozen(sec.get(name, default, lambda f, v, k=kind, a=allowed: _parse(f, k, v, a)))))
    sec.close()
    top.close()
    setting = DynamoPlannerSetting(tuple(values), tuple(sched))
    try:
        setting.validate()
    except NotModelled:
        pass   # a field the adapter cannot honour: named when the planner is built
    except ConfigError as e:
        name = str(e.field).removeprefix("planner_config")
        message = str(e).split(": ", 1)[-1]
        raise ConfigError(f"{where}{name}" if name.startswith(".") else where, message) from None
    return setting
