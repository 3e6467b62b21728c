"""The layered control stack (article section 22): one controller composed of layers, each with
its own sample period, from milliseconds to hours.

A :class:`ControlStack` is itself a controller (``sample_period``, ``reset()``, ``update(t, m)``), so
a plant runs it like any other; inside, it dispatches each layer at the layer's own period:

* ``batch_gate`` (sub-second) - the decode batch cap: the gated batch controller
  (:class:`tokenfactory.controllers.batch_gate.BatchGate`, a
  :class:`tokenfactory.core.signals.BatchCapAction`), or the slot limit, a static cap applied to the
  plant's parameters (a :class:`StackLayer` with no controllers documents it);
* ``admission`` (seconds) - an admission controller (:class:`tokenfactory.core.signals.AdmissionAction`);
* ``reconfiguration`` (minutes) - pool controllers (:class:`tokenfactory.core.signals.ScaleAction`),
  optionally a :class:`RoleBalancer` that moves workers between roles in a fixed fleet;
* ``planning`` (hours) - a :class:`tokenfactory.controllers.planning.DemandPlanner` whose plan
  is read by the reconfiguration layer as a feed-forward floor (it returns no action itself).

Multi-rate dispatch: the stack is sampled at its base period (the fastest sampled layer's); a
layer whose period is a multiple of it runs every k-th sample and gets a measurement whose rates
(arrivals, admissions, completions) are averaged over *its own* period from the base samples -
what a scrape of counters at the layer's period gives - so a slow layer sees the same signal it
would see sampled on its own. Layers run slowest first, so a plan updated at t is read by the
reconfiguration layer at the same t. Actions of all layers are returned as one list (one
admission action, one batch cap and one reservation at most).

For the request simulator, which samples admission and autoscalers separately,
:meth:`ControlStack.split` gives two views of the *same* layer objects.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from tokenfactory.controllers.interface import SampledController
from tokenfactory.core.signals import AdmissionAction, Measurement, ScaleAction, sort_actions, split_action
from tokenfactory.core.validation import ConfigError, check_number

__all__ = ["StackLayer", "ControlStack", "RoleBalancer", "CapacityScaledBound", "LAYER_ORDER"]

#: the layers of a stack, fastest first (the order the article's section 22 lists them in)
LAYER_ORDER = ("batch_gate", "admission", "reconfiguration", "planning")
_RATE_FIELDS = ("completion_rate", "admitted_rate", "arrival_rate")


@dataclass
class StackLayer:
    """One layer: its name (one of :data:`LAYER_ORDER`), its controllers and its sample period.

    A layer without controllers is static (the slot limit standing in for the batch gate): it is
    listed for the separation analysis and the certificate but never sampled. ``note`` says what
    a static layer is.

    Parameters
    ----------
    name : str
        One of :data:`LAYER_ORDER`.
    controllers : list
        The layer's sampled controllers (empty: a static layer).
    sample_period : float
        The layer's period (s; default the slowest of its controllers').
    note : str
        What a static layer is (reported).
    """

    name: str
    controllers: list = field(default_factory=list)
    sample_period: float = math.nan
    note: str = ""

    def __post_init__(self) -> None:
        if self.name not in LAYER_ORDER:
            raise ConfigError("stack.layer", f"{self.name!r} is not one of {', '.join(LAYER_ORDER)}")
        self.controllers = list(self.controllers)
        if self.controllers:
            if not math.isfinite(self.sample_period):
                self.sample_period = max(c.sample_period for c in self.controllers)
            check_number(f"stack.{self.name}.sample_period", self.sample_period, low=0.0, low_inclusive=False)
            for c in self.controllers:
                if not math.isclose(c.sample_period, self.sample_period, rel_tol=1e-9):
                    raise ConfigError(f"stack.{self.name}.sample_period",
                                      f"{type(c).__name__} samples every {c.sample_period:g} s, the layer every "
                                      f"{self.sample_period:g} s: one layer, one period")

    @property
    def sampled(self) -> bool:
        return bool(self.controllers)


class ControlStack(SampledController):
    """Layers composed into one controller (see the module docstring).

    Parameters
    ----------
    layers : sequence of StackLayer
        At most one per name; any order (they are kept fastest first).
    name : str
        A label for results.
    """

    name = "stack"

    def __init__(self, layers: Sequence[StackLayer], name: str = "stack"):
        layers = list(layers)
        names = [la.name for la in layers]
        if len(set(names)) != len(names):
            raise ConfigError("stack.layers", f"a layer appears twice: {names}")
        self.layers = sorted(layers, key=lambda la: LAYER_ORDER.index(la.name))
        sampled = [la for la in self.layers if la.sampled]
        if not sampled:
            raise ConfigError("stack.layers", "needs at least one layer with a controller")
        base = min(la.sample_period for la in sampled)
        for la in sampled:
            k = la.sample_period / base
            if abs(k - round(k)) > 1e-6:
                raise ConfigError(f"stack.{la.name}.sample_period", f"{la.sample_period:g} s is not a multiple of "
                                  f"the fastest layer's {base:g} s")
        super().__init__(base)
        self.label = name
        self._every = {la.name: int(round(la.sample_period / base)) for la in sampled}
        # a per-request gate in the admission layer (SLO-aware admission's decide) is the stack's:
        # the request simulator asks it at every arrival
        gates = [c.decide for la in sampled if la.name == "admission" for c in la.controllers if hasattr(c, "decide")]
        if gates:
            self.decide = gates[0]
        # and its outer loop hears the admitted requests' outcomes
        observers = [c.observe for la in sampled if la.name == "admission" for c in la.controllers
                     if hasattr(c, "observe")]
        if observers:
            self.observe = observers[0]
        self.reset()

    def layer(self, name: str) -> StackLayer | None:
        """The layer called ``name`` (None if the stack has none)."""
        return next((la for la in self.layers if la.name == name), None)

    @property
    def controllers(self) -> list:
        """Every sampled controller, fastest layer first."""
        return [c for la in self.layers for c in la.controllers]

    def reset(self) -> None:
        for c in self.controllers:
            c.reset()
        self._k = 0
        self._acc = {n: {f: 0.0 for f in _RATE_FIELDS} for n in self._every}
        self._cnt = {n: 0 for n in self._every}
        self.log: list[tuple[float, str]] = []  # (time, layer) of every layer sample: the schedule, as run

    def _accumulate(self, name: str, m: Measurement) -> None:
        acc = self._acc[name]
        for f in _RATE_FIELDS:
            acc[f] += getattr(m, f)  # NaN (a plant that does not report it) stays NaN
        self._cnt[name] += 1

    def _windowed(self, name: str, m: Measurement) -> Measurement:
        """``m`` with its rates averaged over the layer's own period (from the base samples)."""
        if self._every[name] == 1:
            return m
        acc, cnt = self._acc[name], self._cnt[name]
        return dataclasses.replace(m, **{f: acc[f] / cnt for f in _RATE_FIELDS})

    def update(self, t: float, m: Measurement) -> list:
        """Run every layer due at this base sample (slowest first); return their actions."""
        return self._run(t, m, tuple(self._every))

    def _run(self, t: float, m: Measurement, names: tuple[str, ...]) -> list:
        out: list = []
        admission: AdmissionAction | None = None
        others: dict[str, object] = {}  # the batch cap and the reservation (one of each)
        due = []
        for la in self.layers:
            if la.name not in names or not la.sampled:
                continue
            if self._every[la.name] > 1:
                self._accumulate(la.name, m)
            if self._k % self._every[la.name] == 0:
                due.append(la)
        self._k += 1
        for la in reversed(due):  # slowest first: a fresh plan is read by the faster layers at once
            mw = self._windowed(la.name, m)
            self._acc[la.name] = dict.fromkeys(_RATE_FIELDS, 0.0)
            self._cnt[la.name] = 0
            self.log.append((t, la.name))
            for c in la.controllers:
                acts = sort_actions(c.update(t, mw))
                if acts.admission is not None:
                    admission = acts.admission
                out += acts.scales
                others.update({k: a for k, a in (("batch_cap", acts.batch_cap), ("reserve", acts.reserve))
                               if a is not None})
        return ([admission] if admission is not None else []) + out + list(others.values())

    def split(self) -> tuple["ControlStack | None", list]:
        """Two views for a plant that samples admission and autoscalers separately (the request
        simulator): ``(admission view or None, [scaling view])``, each a :class:`ControlStack` over
        the *same* layer objects (the batch gate and admission; the slower layers) with its own
        multi-rate dispatch."""
        adm_layers = tuple(n for n in self._every if n in ("batch_gate", "admission"))
        scale_layers = tuple(n for n in self._every if n not in adm_layers)
        adm = ControlStack([self.layer(n) for n in adm_layers], f"{self.label}:admission") if adm_layers else None
        return adm, ([ControlStack([self.layer(n) for n in scale_layers], f"{self.label}:scaling")]
                     if scale_layers else [])

    def params(self) -> dict:
        return {"name": self.label, "sample_period": self.sample_period,
                "layers": [{"layer": la.name, "sample_period": la.sample_period if la.sampled else None,
                            "note": la.note,
                            "controllers": [{"name": type(c).__name__, **(c.params() if hasattr(c, "params") else {})}
                                            for c in la.controllers]} for la in self.layers]}


class RoleBalancer(SampledController):
    """Pool controllers sharing a fixed fleet: when one pool wants workers the fleet does not have
    free, workers the other pool holds beyond its need (rounded up) are released to it - a role
    move costs the drain plus the start-up in the new role (the plant's fixed-fleet rule).

    Each pool controller decides as it would alone; the balancer only lowers the other pool's
    target, never below ceil(its need), so it adds no decision of its own that feedback could
    chase (the released pool is one the hysteretic rule would shrink anyway after its dwell).

    Parameters
    ----------
    controllers : sequence
        One :class:`tokenfactory.controllers.reconfiguration.HystereticPoolController` (or
        subclass) per pool, sharing one sample period.
    fleet_size : int
        Workers the two pools share.
    """

    name = "role-balancer"

    def __init__(self, controllers: Sequence, fleet_size: int):
        controllers = list(controllers)
        if len(controllers) != 2 or {c.pool for c in controllers} != {"fill", "decode"}:
            raise ConfigError("role_balancer.controllers", "needs one controller per pool (fill and decode)")
        periods = {c.sample_period for c in controllers}
        if len(periods) != 1:
            raise ConfigError("role_balancer.controllers", f"pool controllers sample at different periods {periods}")
        super().__init__(periods.pop())
        self.controllers = controllers
        self.fleet_size = int(fleet_size)
        self.moves = 0

    def reset(self) -> None:
        for c in self.controllers:
            c.reset()
        self.moves = 0

    def update(self, t: float, m: Measurement) -> list[ScaleAction]:
        acts = {}
        for c in self.controllers:
            _, scales = split_action(c.update(t, m))
            for a in scales:
                acts[a.pool] = a.replicas
        want = dict(acts)
        total = sum(want.values())
        if total > self.fleet_size:
            for c in self.controllers:
                other = next(o for o in self.controllers if o is not c)
                cur = _provisioned(m, c.pool)
                if want[c.pool] > cur:  # c wants more: take spare workers from the other pool
                    floor = max(math.ceil(other.last_need - 1e-9) if math.isfinite(other.last_need) else 0,
                                other.min_replicas)
                    spare = max(want[other.pool] - floor, 0)
                    give = min(spare, total - self.fleet_size)
                    if give > 0:
                        want[other.pool] -= give
                        total -= give
                        self.moves += give
        return [ScaleAction(p, n) for p, n in want.items()]

    def params(self) -> dict:
        return {"fleet_size": self.fleet_size, "sample_period": self.sample_period,
                "pools": [{"name": type(c).__name__, **c.params()} for c in self.controllers]}


def _provisioned(m: Measurement, pool: str) -> int:
    n = m.decode_workers + m.decode_workers_starting if pool == "decode" else m.fill_workers + m.fill_workers_starting
    return int(round(n)) if math.isfinite(n) else 0


class CapacityScaledBound(SampledController):
    """An admission controller whose backlog bound follows the decode pool: an admission tuned at
    one pool size sheds backlog over ``backlog_bound`` requests - a time (seconds of decode
    capacity) frozen into a count. When the reconfiguration layer grows the pool, the same count
    is fewer seconds and the stack would shed traffic it can serve; the bound is rescaled by
    (decode slots now / decode slots at tuning) every sample, so it stays the same number of
    seconds of capacity, plus what the next sample period releases at the commanded rate.
    Everything else is the wrapped controller's.

    Parameters
    ----------
    admission : SampledController
        The admission controller (its ``backlog_bound`` and, if it has one, ``target_ready`` are
        rescaled).
    nominal_decode_slots : float
        Decode slots of the pool the admission was tuned at (> 0).
    """

    name = "capacity-scaled"

    def __init__(self, admission, nominal_decode_slots: float):
        super().__init__(admission.sample_period)
        self.admission = admission
        self.nominal_decode_slots = check_number("admission.nominal_decode_slots", nominal_decode_slots, low=0.0,
                                                 low_inclusive=False)

    def reset(self) -> None:
        self.admission.reset()
        self._target0 = getattr(self.admission, "target_ready", None)

    def update(self, t: float, m: Measurement) -> AdmissionAction:
        if self._target0 is not None and m.decode_slots > 0:
            # the ready target is c x theta_eff (+ safety): seconds of the decode pool's consumption
            self.admission.target_ready = self._target0 * m.decode_slots / self.nominal_decode_slots
        a = self.admission.update(t, m)
        if not isinstance(a, AdmissionAction) or not math.isfinite(a.backlog_bound) or m.decode_slots <= 0:
            return a
        # requests the next sample releases anyway are not waiting past the bound (a coarse plant
        # step checks the bound before it admits the step's arrivals)
        release = a.rate * self.sample_period if math.isfinite(a.rate) else 0.0
        return AdmissionAction(a.rate, a.backlog_bound * m.decode_slots / self.nominal_decode_slots + release,
                               a.reason)

    def transfer_function(self):
        return self.admission.transfer_function()

    def params(self) -> dict:
        return {**self.admission.params(), "bound_scaled_from_decode_slots": self.nominal_decode_slots}
