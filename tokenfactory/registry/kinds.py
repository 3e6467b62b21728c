"""The registry's kind table: :class:`ControllerKind`, :func:`register`, the admission and
autoscaler tables, and what every builder is given (:class:`PlantContext`); the kinds themselves
are registered by :mod:`~tokenfactory.registry.admission_kinds` and
:mod:`~tokenfactory.registry.autoscaler_kinds`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tokenfactory.controllers.autotune import StabilityEnvelope
from tokenfactory.core.classes import DEFAULT_CLASSES, INTERACTIVE, RequestClass, class_table
from tokenfactory.core.validation import ConfigError, check_settings, reject_unknown_keys
from tokenfactory.plant_models.fleet import PoolDynamics
from tokenfactory.plant_models.fluid import FluidParams, FluidPlant

__all__ = ["PlantContext", "ControllerKind", "register", "ADMISSION_KINDS", "AUTOSCALER_KINDS", "build_admission",
           "build_autoscalers", "admission_kinds", "autoscaler_kinds", "with_defaults", "TARGET_UTILIZATION",
           "RECOMMENDED_ADMISSION", "DEFAULT_TPOT_FRACTION"]

#: the admission kind tokenfactory recommends (``simulate`` uses it when ``--admission`` is omitted)
RECOMMENDED_ADMISSION = "slo-aware"
#: share of the TPOT SLO a decode pass may take under the batch cap (the rest: ready-buffer waits
#: carried over a request's tokens and the spread of contexts in a batch)
DEFAULT_TPOT_FRACTION = 0.95

#: the utilisation every capacity-based autoscaler targets (15 % headroom for bursts)
TARGET_UTILIZATION = 0.85


@dataclass(frozen=True)
class PlantContext:
    """What a controller builder may know about the plant it will run on.

    Parameters
    ----------
    params : FluidParams
        Roofline rates and delays of one fill and one decode worker at the request shape.
    fill_workers, decode_workers : int
        Pool sizes the controller is tuned for (admission tunes at these; default 1 each).
    slo_ttft_s, slo_tpot_s : float
        The SLO the controller protects: time to first token and time per output token (s;
        defaults 2.0 and 0.1). Smoothed admission sheds what would wait longer than half the
        TTFT SLO; Mooncake early rejection rejects on the TTFT SLO.
    rate_rps : float or None
        Mean demand (requests/s); the hysteretic autoscaler derives its dead band from it and
        refuses to build without it. Default None.
    dynamics : PoolDynamics
        Start-up, warm-up and drain of workers; the hysteretic autoscaler's dwell and cooldown
        follow from start-up and warm-up (the baselines keep their documented timings).
    max_replicas : int
        Upper bound of every autoscaler (workers per pool; default 64); the lower bound is 1.
    arrival_times_s : array or None
        Arrival times of the replayed stream (s); the hysteretic controller measures its need
        noise on them when they span at least 45 minutes (else it uses a Poisson estimate).
    envelope : StabilityEnvelope
        Errors the admission tuning must tolerate (delay and service-rate factors, margin floors).
    service : ServiceModel, optional
        The service model ``params`` was sampled from: the roofline pass time at any batch and
        context and the fill step (the SLO-aware admission and the batch gate use it when given).
    classes : tuple of RequestClass
        Request classes (default empty: an ``interactive`` class with ``slo_ttft_s`` /
        ``slo_tpot_s`` and the default ``batch`` class).
    class_outputs : mapping, optional
        Per class name, ``(mean, short)`` output tokens of its requests (``short`` a low quantile:
        a short request's TPOT carries its ready wait over few tokens); default the plant's mean
        output for every class and a quarter of it.
    snapshot_dt : float
        The plant's sample period of its measurements (s; default 0.1).
    """

    params: FluidParams
    fill_workers: int = 1
    decode_workers: int = 1
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.1
    rate_rps: float | None = None
    dynamics: PoolDynamics = field(default_factory=PoolDynamics)
    max_replicas: int = 64
    arrival_times_s: Any = None
    envelope: StabilityEnvelope = field(default_factory=StabilityEnvelope)
    service: Any = None
    classes: tuple = ()
    class_outputs: Mapping[str, tuple[float, float]] | None = None
    snapshot_dt: float = 0.1

    def class_table(self) -> dict[str, RequestClass]:
        """The classes the controllers protect, highest priority first (:attr:`classes`, or an
        ``interactive`` class at this context's SLO plus the default ``batch`` class).

        Returns
        -------
        dict
            ``name -> RequestClass``.
        """
        if self.classes:
            return class_table(self.classes)
        batch = [c for c in DEFAULT_CLASSES if c.name != INTERACTIVE]
        return class_table([RequestClass(INTERACTIVE, self.slo_ttft_s, self.slo_tpot_s, 0), *batch])

    @property
    def plant(self) -> FluidPlant:
        """The admission-loop fluid plant at these pool sizes (what admission is tuned on)."""
        return FluidPlant(self.params, self.fill_workers, self.decode_workers)


@dataclass(frozen=True)
class ControllerKind:
    """One registered controller kind.

    Parameters
    ----------
    name : str
        The name users type (``--admission NAME``, ``kind = "NAME"``).
    layer : str
        ``"admission"`` or ``"reconfiguration"``.
    summary : str
        One line: what it is and whose it is.
    build : callable
        ``build(ctx, params) -> controller`` (admission; ``None`` for no controller) or a list of
        controllers, one per pool (reconfiguration).
    keys : tuple of str
        Parameters the builder accepts; anything else is rejected (default: the keys of
        ``settings``).
    baseline : bool
        True for today's systems, False for tokenfactory's own controllers.
    build_tuned : callable, optional
        ``build_tuned(ctx, params, where=...) -> (controller, tuning report)`` for a kind tuned
        from the plant (scenario files report the tuning).
    scenario_defaults : mapping
        Parameters a scenario file's ``[controller]`` table gets unless it sets them.
    settings : mapping
        ``{key: setting(...)}``: each parameter's type, unit, range, default and meaning (what
        ``describe schema kinds`` prints and :func:`build_admission` checks). The one place a
        parameter's default is declared: the builder reads it through :func:`with_defaults`
        (a default of ``None`` is derived from the plant, as the meaning says).
    """

    name: str
    layer: str
    summary: str
    build: Callable[[PlantContext, dict], Any]
    keys: tuple[str, ...] = ()
    baseline: bool = False
    build_tuned: Callable[..., tuple[Any, Any]] | None = None
    scenario_defaults: Mapping[str, Any] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.settings and not self.keys:
            object.__setattr__(self, "keys", tuple(self.settings))
        if self.settings and tuple(self.settings) != tuple(self.keys):
            raise ConfigError("kind.keys", f"{self.name}: keys {self.keys} differ from its settings' "
                              f"{tuple(self.settings)}")


def with_defaults(settings: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` over the declared defaults of ``settings`` (``{key: setting(...)}``; a default of
    ``None`` - derived from the plant by the builder - is left out, so ``key in params`` still says
    the user set it).

    Parameters
    ----------
    settings : mapping
        A kind's ``{key: setting(...)}``.
    params : mapping
        The parameters given.

    Returns
    -------
    dict
    """
    return {**{k: f.default for k, f in settings.items() if f.default is not None}, **params}


ADMISSION_KINDS: dict[str, ControllerKind] = {}
AUTOSCALER_KINDS: dict[str, ControllerKind] = {}


def register(kind: ControllerKind) -> ControllerKind:
    """Add ``kind`` to the registry of its layer (a name may be registered once).

    Parameters
    ----------
    kind : ControllerKind
        The kind to add.

    Returns
    -------
    ControllerKind
        ``kind``, so the call can be used as an expression.
    """
    table = {"admission": ADMISSION_KINDS, "reconfiguration": AUTOSCALER_KINDS}.get(kind.layer)
    if table is None:
        raise ConfigError("kind.layer", f"{kind.layer!r} is not one of 'admission', 'reconfiguration'")
    if kind.name in table:
        raise ConfigError("kind.name", f"{kind.name!r} is already registered in the {kind.layer} layer")
    table[kind.name] = kind
    return kind


def admission_kinds() -> tuple[str, ...]:
    """Names of the registered admission kinds, in registration order.

    Returns
    -------
    tuple of str
        What ``tokenfactory simulate --admission`` and a scenario's ``[controller] kind`` accept.
    """
    return tuple(ADMISSION_KINDS)


def autoscaler_kinds() -> tuple[str, ...]:
    """Names of the registered autoscaler kinds, in registration order.

    Returns
    -------
    tuple of str
        The kinds :func:`build_autoscalers` accepts.
    """
    return tuple(AUTOSCALER_KINDS)


def _lookup(table: Mapping[str, ControllerKind], kind: str, where: str) -> ControllerKind:
    if kind not in table:
        raise ConfigError(where, f"{kind!r} is not one of {', '.join(table)}")
    return table[kind]


def build_admission(kind: str, ctx: PlantContext, params: Mapping[str, Any] | None = None,
                    where: str = "admission") -> Any:
    """A fresh admission controller of ``kind`` for the plant in ``ctx``.

    Parameters
    ----------
    kind : str
        A registered admission kind (:func:`admission_kinds`).
    ctx : PlantContext
        The plant it will run on.
    params : mapping, optional
        The kind's parameters (its ``keys``; a ``kind`` entry is ignored, so a scenario's
        ``[controller]`` table can be passed whole); unknown ones raise :class:`ConfigError`.
    where : str
        Field path used in error messages (default ``"admission"``).

    Returns
    -------
    controller or None
        ``None`` for ``open`` (admit everything).
    """
    k = _lookup(ADMISSION_KINDS, kind, f"{where}.kind" if params else where)
    p = dict(params or {})
    p.pop("kind", None)
    reject_unknown_keys(where, p, k.keys)
    _check_documented(where, k, p)
    return k.build(ctx, p)


def build_autoscalers(kind: str, ctx: PlantContext, params: Mapping[str, Any] | None = None,
                      where: str = "autoscaler") -> list:
    """Fresh autoscalers of ``kind``, one per pool, with their documented defaults.

    The capacity-based kinds (``dynamo-throughput``, ``hysteretic``) size pools to the roofline
    per-worker capacity x :data:`TARGET_UTILIZATION`. The metric-target kinds keep their own
    targets: ``hpa`` and ``apa`` 0.7 fill utilisation and 0.8 KV occupancy, ``kpa`` 0.7 and
    0.8 of a replica's concurrency at full rate (Little's law), ``dynamo-load`` Dynamo's
    ``load`` target (:func:`~tokenfactory.controllers.autoscaling.dynamo_load_thresholds`). Every kind is bounded to [1, ``ctx.max_replicas``].

    Parameters
    ----------
    kind : str
        A registered autoscaler kind (:func:`autoscaler_kinds`).
    ctx : PlantContext
        The plant and demand they size.
    params : mapping, optional
        The kind's parameters (a ``kind`` entry is ignored); unknown ones raise
        :class:`ConfigError`.
    where : str
        Field path used in error messages (default ``"autoscaler"``).

    Returns
    -------
    list
        One controller per pool (fill, decode).
    """
    k = _lookup(AUTOSCALER_KINDS, kind, where)
    p = dict(params or {})
    p.pop("kind", None)
    reject_unknown_keys(where, p, k.keys)
    _check_documented(where, k, p)
    return k.build(ctx, p)


def _check_documented(where: str, k: ControllerKind, p: Mapping[str, Any]) -> None:
    """Check a kind's parameters against their documented types and ranges (its ``settings``),
    naming the key the user wrote."""
    if k.settings:
        check_settings(where, p, k.settings)
