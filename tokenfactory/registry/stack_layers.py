"""The stack's layer kinds: one typed, frozen config per kind, registered by name here and nowhere
else.

A stack scenario's ``[layers.NAME]`` table names a kind (``kind = "..."``); :func:`stack_layer_config`
looks the kind up in :data:`STACK_LAYER_KINDS` and resolves the table into the kind's config once
(:func:`tokenfactory.core.validation.resolve_config`: unknown keys rejected by name, every value
checked against its field's type and range). Each field carries its type, unit, range, default
and meaning as metadata (:func:`tokenfactory.core.validation.config_schema` lists them). A
default of ``None`` means "the builder's own default" (named in the meaning) or a value derived
from the rest of the scenario.

Each kind's config class is its whole registry entry: besides its settings it names its builder
(``builder``, in :mod:`tokenfactory.stack.layer_builders`), its certificate loops (``certificate``, in
:mod:`tokenfactory.stack.layer_certificates`) and the settings the certificate may search for a
passing value (``knobs``). :func:`tokenfactory.stack.build_stack` and :func:`tokenfactory.stack.certify`
call :meth:`StackLayerConfig.build` / :meth:`StackLayerConfig.certify` on every layer; adding a kind
is one config class here (added to :data:`STACK_LAYER_KINDS`) and its two functions there. What a
plant derivation reads of a kind is data on the config (``bounds_own_ready_wait``,
``samples_live_pass``), never the kind's name.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, ClassVar

from tokenfactory.controllers.planning import DemandPlannerConfig, PlannedPoolConfig

#: the controllers' own defaults (declared once, in their configs), for the layer settings that keep them
_PLANNER = {f.name: f.default for f in dataclasses.fields(DemandPlannerConfig)}
_POOLS = {f.name: f.default for f in dataclasses.fields(PlannedPoolConfig)}
from tokenfactory.core.validation import ConfigError, check_choice, config_schema, resolve_config, setting

__all__ = ["StackLayerConfig", "SlotLimitGate", "GatedBatchCap", "SmoothedAdmissionLayer", "SLOAwareAdmissionLayer",
           "PlannedHystereticLayer", "ControlPlaneLayer", "SeasonalRiseLayer", "STACK_LAYER_KINDS", "STACK_LAYERS", "NO_LAYER",
           "stack_layer_config", "layer_schema", "BUILDERS", "CERTIFICATES"]

#: the kind that leaves an optional layer out of the stack
NO_LAYER = "none"
#: where the kinds' builders and certificate loops live (the stack package, this layer; imported when first
#: used, since the stack imports these configs)
BUILDERS = "tokenfactory.stack.layer_builders"
CERTIFICATES = "tokenfactory.stack.layer_certificates"


@dataclass(frozen=True)
class StackLayerConfig:
    """What every stack layer config has: its layer and kind (class attributes) and
    :meth:`builder_params` (the settings given, for a registry builder)."""

    layer: ClassVar[str] = ""
    kind: ClassVar[str] = ""
    #: the kind's builder, a function of :data:`BUILDERS`: ``(config, LayerBuild) -> StackLayer``
    builder: ClassVar[str] = ""
    #: the kind's certificate loops, a function of :data:`CERTIFICATES`: ``(config, CertificateDraft) -> LayerLoops``
    certificate: ClassVar[str] = ""
    #: the settings the certificate may change to name a passing value when the layer fails a check
    knobs: ClassVar[tuple[str, ...]] = ()

    def build(self, b) -> Any:
        """The layer's controllers (:mod:`tokenfactory.stack.layer_builders`).

        Parameters
        ----------
        b : tokenfactory.stack.layer_builders.LayerBuild
            The scenario, the gated plant, the run's settings and the layers above.

        Returns
        -------
        StackLayer
        """
        return getattr(importlib.import_module(BUILDERS), self.builder)(self, b)

    def certify(self, d) -> Any:
        """The layer's certificate loops (:mod:`tokenfactory.stack.layer_certificates`).

        Parameters
        ----------
        d : tokenfactory.stack.layer_certificates.CertificateDraft
            The certificate so far (and the loops of the layers below).

        Returns
        -------
        LayerLoops
        """
        return getattr(importlib.import_module(CERTIFICATES), self.certificate)(self, d)

    def builder_params(self, *skip: str) -> dict[str, Any]:
        """The settings that are set (not ``None``), minus ``skip``: what a registry builder takes
        (it applies its own defaults to the rest).

        Parameters
        ----------
        *skip : str
            Settings the caller passes itself.

        Returns
        -------
        dict
        """
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None and f.name not in skip}

    def to_dict(self) -> dict[str, Any]:
        """The resolved config with its kind (written into results).

        Returns
        -------
        dict
        """
        return {"kind": self.kind, **dataclasses.asdict(self)}


_PASS_SHARE = dict(low=0.1, high=1.0, also=("auto",), unit="",
                   meaning='share of the TPOT SLO a decode pass may take; "auto": derived from the admission layer '
                           "(tokenfactory.stack.gate_fraction)")


@dataclass(frozen=True)
class SlotLimitGate(StackLayerConfig):
    """``slot-limit``: the static batch cap, decode slots capped at the largest batch whose pass
    meets its share of the TPOT SLO (no controller).

    Parameters
    ----------
    tpot_fraction : float or "auto"
        Share of the TPOT SLO a decode pass may take.
    """

    layer: ClassVar[str] = "batch_gate"
    kind: ClassVar[str] = "slot-limit"
    builder: ClassVar[str] = "build_slot_limit"
    certificate: ClassVar[str] = "certify_slot_limit"  # static: its response is one pass
    samples_live_pass: ClassVar[bool] = False  # a static cap: no loop of its own
    knobs: ClassVar[tuple[str, ...]] = ("tpot_fraction",)
    tpot_fraction: float | str = setting("auto", **_PASS_SHARE)


@dataclass(frozen=True)
class GatedBatchCap(StackLayerConfig):
    """``gated``: the gated decode batch cap (:class:`tokenfactory.controllers.batch_gate.BatchGate`).

    Parameters
    ----------
    tpot_fraction : float or "auto"
        Share of the TPOT SLO a decode pass may take.
    sample_period_s : float
        The cap's sample period (s).
    """

    layer: ClassVar[str] = "batch_gate"
    kind: ClassVar[str] = "gated"
    builder: ClassVar[str] = "build_gated_cap"
    certificate: ClassVar[str] = "certify_gated_cap"  # an integral loop on the measured pass time
    samples_live_pass: ClassVar[bool] = True
    knobs: ClassVar[tuple[str, ...]] = ("sample_period_s", "tpot_fraction")
    tpot_fraction: float | str = setting("auto", **_PASS_SHARE)
    sample_period_s: float = setting(0.25, unit="s", low=0.01, high=60.0,
                                     meaning="the cap's sample period (the overload study's gate)")


@dataclass(frozen=True)
class SmoothedAdmissionLayer(StackLayerConfig):
    """``smoothed``: feed-forward + PI admission on the filtered ready buffer
    (:func:`tokenfactory.registry.smoothed_admission`), its backlog bound scaled with the decode pool.

    Parameters
    ----------
    sample_period_s : float
        Admission's sample period (s).
    filter_tau_s, service_filter_tau_s : float, optional
        Time constants of the ready-buffer and service-rate filters (s; builder's defaults).
    safety_z : float, optional
        Poisson safety factor of the ready target (builder's default).
    backlog_bound_s : float, optional
        Backlog bound in seconds of decode capacity (builder's default).
    """

    layer: ClassVar[str] = "admission"
    kind: ClassVar[str] = "smoothed"
    builder: ClassVar[str] = "build_smoothed_admission"
    certificate: ClassVar[str] = "certify_smoothed_admission"
    knobs: ClassVar[tuple[str, ...]] = ("sample_period_s", "filter_tau_s", "service_filter_tau_s", "safety_z",
                                        "backlog_bound_s")
    bounds_own_ready_wait: ClassVar[bool] = False  # the batch gate leaves room for its ready wait
    sample_period_s: float = setting(1.0, unit="s", low=0.01, high=60.0, meaning="admission's sample period")
    filter_tau_s: float | None = setting(None, unit="s", low=0.0, meaning="ready-buffer filter time constant "
                                         "(default: the builder's, from the loop delay)")
    service_filter_tau_s: float | None = setting(None, unit="s", low=0.0, meaning="service-rate filter time constant "
                                                 "(default: the builder's)")
    safety_z: float | None = setting(None, low=0.0, meaning="Poisson safety factor of the ready target "
                                     "(default: the builder's)")
    backlog_bound_s: float | None = setting(None, unit="s", low=0.0, low_inclusive=False,
                                            meaning="backlog bound in seconds of decode capacity (default: the "
                                                    "builder's)")


@dataclass(frozen=True)
class SLOAwareAdmissionLayer(StackLayerConfig):
    """``slo-aware``: per-request admit/defer/reject on predicted TTFT and decode wait
    (:func:`tokenfactory.registry.slo_aware_admission`), built without a batch gate of its own.

    Parameters
    ----------
    sample_period_s : float
        Admission's sample period (s).
    filter_tau_s : float, optional
        Rate filter time constant (s; builder's default).
    ttft_fraction, wait_target_fraction : float, optional
        Shares of the TTFT SLO for the fill wait limit and its target (builder's defaults).
    tpot_fraction : float, optional
        Its decode pass target as a share of the TPOT SLO (default
        :data:`tokenfactory.registry.DEFAULT_TPOT_FRACTION`).
    reserve_z, completion_z : float, optional
        Quantiles of the reservation and of the completions it counts on (builder's defaults).
    """

    layer: ClassVar[str] = "admission"
    kind: ClassVar[str] = "slo-aware"
    builder: ClassVar[str] = "build_slo_aware_admission"
    certificate: ClassVar[str] = "certify_slo_aware_admission"
    knobs: ClassVar[tuple[str, ...]] = ("sample_period_s", "filter_tau_s", "ttft_fraction", "wait_target_fraction",
                                        "tpot_fraction")
    bounds_own_ready_wait: ClassVar[bool] = True  # it bounds each request's ready wait itself
    sample_period_s: float = setting(1.0, unit="s", low=0.01, high=60.0, meaning="admission's sample period")
    filter_tau_s: float | None = setting(None, unit="s", low=0.0, meaning="rate filter time constant "
                                         "(default: the builder's)")
    ttft_fraction: float | None = setting(None, low=0.0, high=1.0, low_inclusive=False,
                                          meaning="share of the TTFT SLO a predicted fill wait may take "
                                                  "(default: the builder's)")
    wait_target_fraction: float | None = setting(None, low=0.0, high=1.0, low_inclusive=False,
                                                 meaning="share of the limit its wait correction aims at "
                                                         "(default: the builder's)")
    tpot_fraction: float | None = setting(None, low=0.0, high=1.0, low_inclusive=False,
                                          meaning="its decode pass target as a share of the TPOT SLO "
                                                  "(default: registry.DEFAULT_TPOT_FRACTION)")
    reserve_z: float | None = setting(None, low=0.0, meaning="quantile (z) of the top class's reservation "
                                      "(default: the builder's)")
    completion_z: float | None = setting(None, low=0.0, meaning="quantile (z) of the completions it counts on "
                                         "(default: the builder's)")


@dataclass(frozen=True)
class PlannedHystereticLayer(StackLayerConfig):
    """``planned-hysteretic``: both pools' :class:`tokenfactory.controllers.planning.PlannedPoolController`
    (the hysteretic rule with the planner's hold and cooldown hooks).

    Parameters
    ----------
    sample_period_s : float
        The layer's sample period (s).
    target_utilization : float
        Utilisation the pools are sized for.
    queue_clear_s : float, optional
        Backlog-clearance time (s; default SIMC over the start-up envelope).
    filter_s : float
        Rate filter time constant (s).
    min_dead_band : float
        Smallest dead band (workers).
    max_step_up, max_step_down : int
        Largest change per decision (workers).
    queue_headroom : float
        Cap of the backlog term as a share of the pool.
    role_moves : bool
        In a fixed fleet, release a pool's spare workers to the other.
    fleet_size : int, optional
        A fixed fleet (workers).
    headroom : float
        Fixed margin over the need (the planner's floor in a fixed fleet).
    dwell_s : float, optional
        Hold before a scale-down (s; default max(3 filter constants, start-up + warm-up)).
    cooldown_s, down_cooldown_s : float, optional
        Cooldowns after a scale-up / scale-down (s; the controller's defaults).
    """

    layer: ClassVar[str] = "reconfiguration"
    kind: ClassVar[str] = "planned-hysteretic"
    builder: ClassVar[str] = "build_planned_pools"
    certificate: ClassVar[str] = "certify_planned_pools"
    knobs: ClassVar[tuple[str, ...]] = ("sample_period_s", "target_utilization", "queue_clear_s", "filter_s",
                                        "min_dead_band")
    sample_period_s: float = setting(10.0, unit="s", low=0.1, high=3600.0, meaning="the layer's sample period")
    target_utilization: float = setting(_POOLS["target_utilization"], low=0.1, high=1.0,
                                        meaning="utilisation the pools are sized for")
    queue_clear_s: float | None = setting(None, unit="s", low=0.0, low_inclusive=False,
                                          meaning="backlog-clearance time (default: SIMC over the start-up envelope)")
    filter_s: float = setting(_POOLS["filter_s"], unit="s", low=0.0, meaning="rate filter time constant")
    min_dead_band: float = setting(0.25, unit="workers", low=0.0, meaning="smallest dead band of the relay")
    max_step_up: int = setting(_POOLS["max_step_up"], kind=int, unit="workers", low=1,
                               meaning="largest scale-up per decision")
    max_step_down: int = setting(_POOLS["max_step_down"], kind=int, unit="workers", low=1,
                                 meaning="largest scale-down per decision")
    queue_headroom: float = setting(_POOLS["queue_headroom"], low=0.0,
                                    meaning="cap of the backlog term as a share of the pool")
    role_moves: bool = setting(True, kind=bool, meaning="in a fixed fleet, release spare workers to the other pool")
    fleet_size: int | None = setting(None, kind=int, unit="workers", low=2, meaning="a fixed fleet (default: none)")
    headroom: float = setting(_POOLS["headroom"], low=0.0, high=2.0, meaning="fixed margin over the need")
    dwell_s: float | None = setting(None, unit="s", low=0.0, meaning="hold before a scale-down (default: max(3 "
                                                                     "filter constants, start-up + warm-up))")
    cooldown_s: float | None = setting(None, unit="s", low=0.0, meaning="cooldown after a scale-up "
                                       "(default: the controller's)")
    down_cooldown_s: float | None = setting(None, unit="s", low=0.0, meaning="cooldown after a scale-down "
                                            "(default: the controller's)")


@dataclass(frozen=True)
class ControlPlaneLayer(StackLayerConfig):
    """``control-plane``: the control plane a user runs, from its own settings file (a Kubernetes
    HPA, KEDA ScaledObject, Knative Service, Ray Serve config, AIBrix PodAutoscaler or Dynamo
    planner config; :mod:`tokenfactory.controllers.formats`), with exactly the file's parameters.
    An autoscaler sizes one pool (the other stays at the scenario's size), certified with its loop
    model (:mod:`tokenfactory.controllers.autoscaler_loops`); Dynamo's real planner sizes both,
    certified with :mod:`tokenfactory.controllers.dynamo_planner_loop` (the layer's pool, or the
    other where that one fails).

    Parameters
    ----------
    file : str
        The settings file (a path relative to the scenario file).
    pool : str
        The pool it sizes: ``"decode"`` or ``"fill"``.
    target_utilization : float
        Utilisation the other layers' certificates size the pools at.
    """

    layer: ClassVar[str] = "reconfiguration"
    kind: ClassVar[str] = "control-plane"
    builder: ClassVar[str] = "build_control_plane"
    # the user's file decides; the certificate judges it as it is and searches the file's own knobs
    certificate: ClassVar[str] = "certify_control_plane"
    file: str = setting("", kind=str, meaning="the control plane's own settings file (relative to the scenario)")
    pool: str = setting("decode", kind=str, choices=("decode", "fill"), meaning="the pool it sizes")
    target_utilization: float = setting(0.85, low=0.1, high=1.0, meaning="utilisation the other layers' "
                                        "certificates size the pools at")

    def read(self):
        """The parsed settings file."""
        from tokenfactory.controllers.formats import read_control_plane

        if not self.file:
            raise ConfigError("layers.reconfiguration.file", "the control-plane layer needs its settings file")
        return read_control_plane(self.file)

    @property
    def sample_period_s(self) -> float:
        """The control plane's own decision period (its sync period, tick or control loop; a
        Dynamo planner's pipeline tick)."""
        setting = self.read()
        if hasattr(setting, "scale_interval_s"):   # Dynamo's planner: built on the plant, its tick is the file's
            return float(setting.scale_interval_s())
        return float(setting.build(self.pool).sample_period)

    @property
    def filter_s(self) -> float:
        """No rate filter of tokenfactory's: the control plane's own windows are in its loop model."""
        return 0.0


@dataclass(frozen=True)
class SeasonalRiseLayer(StackLayerConfig):
    """``seasonal-rise``: :class:`tokenfactory.controllers.planning.DemandPlanner` (rise profile
    and headroom replayed on the last days, refit daily).

    Parameters
    ----------
    days : int
        Days of history the plan is fitted on.
    excess_budget : float, optional
        Share of the demand allowed above capacity (default ``EXCESS_BUDGET_SHARE`` (0.5) x (1 -
        slo.attainment)).
    interval_s : float
        The plan's grid (s).
    refit_s : float
        Refit period (s).
    fine_s : float
        Grid of the rise profile (s).
    max_headroom : float
        Largest headroom tried.
    use_profile : bool
        Use the daily rise profile (else headroom only).
    volatility_window_s : float
        Time constant of the headroom's volatility scale, the short-horizon correction (s; 0 = a
        constant headroom).
    profile_smooth_s : float, optional
        Width of the rise profile's running median (s; default the plan's grid).
    residual_ar1 : bool
        The AR(1) lead correction of the plan (the residual from the median daily level decays
        over the lead; off by default: it did not lower the cost on ServeGen).
    trend_s : float
        The pools size for their rate's rise over the last ``trend_s`` carried on for as long (s,
        at most ``interval_s``; 0 = none).
    hour_phase : bool
        Weight the headroom by the phase of the hour (the lead error's scale there, fitted daily).
    error_state : bool
        Weight the headroom by the tercile of the lead error the plan has just made (its scale
        there, fitted daily; off by default: measured in controllers/planning.py).
    fall_dwell_s : float, optional
        The forecast-fall release: where the daily profile forecasts a fall over the lead, the
        pools release after this dwell instead of their own (s; absent: off - measured dearer on
        m-large's 10-minute row in controllers/planning.py; the headroom's replay follows it).
    """

    layer: ClassVar[str] = "planning"
    kind: ClassVar[str] = "seasonal-rise"
    builder: ClassVar[str] = "build_seasonal_rise"
    certificate: ClassVar[str] = "certify_seasonal_rise"  # feed-forward: its lead is checked
    days: int = setting(_PLANNER["days"], kind=int, unit="days", low=1, high=14,
                        meaning="days of history the plan is fitted on")
    excess_budget: float | None = setting(None, low=0.0, high=0.5, low_inclusive=False, high_inclusive=False,
                                          meaning="share of demand allowed above capacity (default 0.5 x (1 - "
                                                  "slo.attainment): controllers.planning.EXCESS_BUDGET_SHARE)")
    interval_s: float = setting(_PLANNER["interval_s"], unit="s", low=0.0, meaning="the plan's grid")
    refit_s: float = setting(_PLANNER["refit_s"], unit="s", low=0.0, meaning="refit period")
    fine_s: float = setting(_PLANNER["fine_s"], unit="s", low=0.0, meaning="grid of the rise profile")
    max_headroom: float = setting(_PLANNER["max_headroom"], low=0.0, meaning="largest headroom tried")
    use_profile: bool = setting(_PLANNER["use_profile"], kind=bool,
                                meaning="use the daily rise profile (else headroom only)")
    volatility_window_s: float = setting(_PLANNER["volatility_window_s"], unit="s", low=0.0, high=86400.0,
                                         meaning="time constant of the headroom's volatility scale (0: a constant "
                                                 "headroom)")
    profile_smooth_s: float | None = setting(None, unit="s", low=0.0, high=21600.0,
                                             meaning="width of the rise profile's running median (default the "
                                                     "plan's grid)")
    residual_ar1: bool = setting(_PLANNER["residual_ar1"], kind=bool,
                                 meaning="AR(1) lead correction: the residual from the median "
                                         "daily level decays over the lead (phi fitted daily)")
    trend_s: float = setting(_PLANNER["trend_s"], unit="s", low=0.0, high=3600.0,
                             meaning="rising trend: the pools size for their rate's rise over the last trend_s "
                                     "carried on for as long (0: none)")
    hour_phase: bool = setting(_PLANNER["hour_phase"], kind=bool,
                               meaning="weight the headroom by the phase of the hour (the plan's "
                                       "lead error there, fitted daily)")
    error_state: bool = setting(_PLANNER["error_state"], kind=bool,
                                meaning="weight the headroom by the tercile of the lead error the "
                                        "plan has just made (fitted daily)")
    fall_dwell_s: float | None = setting(None, unit="s", low=0.0, high=86400.0,
                                         meaning="forecast-fall release: the pools' scale-down dwell where the "
                                                 "daily profile forecasts a fall over the lead (absent: off)")


#: the stack's layers, bottom (fastest) first, and each layer's kinds by name (the first is the default)
STACK_LAYER_KINDS: dict[str, dict[str, type[StackLayerConfig]]] = {}
for _cls in (SlotLimitGate, GatedBatchCap, SmoothedAdmissionLayer, SLOAwareAdmissionLayer, PlannedHystereticLayer,
             ControlPlaneLayer, SeasonalRiseLayer):
    STACK_LAYER_KINDS.setdefault(_cls.layer, {})[_cls.kind] = _cls
STACK_LAYERS = tuple(STACK_LAYER_KINDS)
#: the layers a stack may leave out (``kind = "none"``)
OPTIONAL_LAYERS = ("batch_gate", "admission", "planning")


def stack_layer_config(layer: str, table: dict[str, Any]) -> StackLayerConfig | None:
    """Resolve a ``[layers.LAYER]`` table into its kind's config (``None`` for ``kind = "none"``).

    Parameters
    ----------
    layer : str
        One of :data:`STACK_LAYERS`.
    table : dict
        The table (its ``kind``, default the layer's first kind, and the kind's settings).

    Returns
    -------
    StackLayerConfig or None

    Raises
    ------
    ConfigError
        An unknown kind, an unknown key (named, with the kind's keys) or a value out of range.
    """
    kinds = STACK_LAYER_KINDS[layer]
    allowed = (*kinds, NO_LAYER) if layer in OPTIONAL_LAYERS else tuple(kinds)
    table = dict(table)
    kind = check_choice(f"layers.{layer}.kind", table.pop("kind", next(iter(kinds))), allowed)
    if kind == NO_LAYER:
        return None
    return resolve_config(kinds[kind], table, f"layers.{layer}")


def layer_schema(layer: str, kind: str) -> list[dict[str, Any]]:
    """The settings of a layer kind: name, type, unit, range, default, meaning.

    Parameters
    ----------
    layer, kind : str
        The layer and its kind.

    Returns
    -------
    list of dict
    """
    if kind not in STACK_LAYER_KINDS.get(layer, {}):
        raise ConfigError(f"layers.{layer}.kind", f"unknown kind {kind!r}")
    return config_schema(STACK_LAYER_KINDS[layer][kind])
