"""SLO-aware admission: admit, defer or reject each request at arrival on its predicted latency
(article section 18: "regulate admission from the smoothed backlog and the predicted service
rate"; "reserve capacity for short interactive work").

:class:`SLOAwareAdmission` regulates the whole path to the first token and into decode, for every
request class (:mod:`tokenfactory.core.classes`):

* **TTFT prediction.** For an arriving request of class k (priority level l) the fill work ahead
  of it is the new prompt tokens (input minus the prefix-cache hit the orchestrator's index
  expects) queued at levels <= l, as last measured, plus what the gate itself admitted since
  that measurement was taken (a ledger: the orchestrator knows what it admitted, so the
  measurement's age is cancelled exactly - a Smith predictor whose model delay is the
  measurement's own timestamp), minus the fill rate times the measurement's age. Predicted
  TTFT = (work ahead + own tokens) / fill rate + one fill step (the step in progress); a level
  below the top sees the fill rate less the share held for the top level.
* **Decode prediction.** The sequences that will hold or wait for decode slots when the request
  reaches decode (active + ready + in fill of its level, plus the ledger, minus what completes
  meanwhile at the roofline's decode time per sequence, less two standard deviations of those
  Poisson completions) against the slots it may use: the top level every slot
  (lower-priority sequences are preempted for it), a lower level the slots the top level
  neither holds nor has reserved. The excess over the slots' completion rate is the predicted
  ready-buffer wait, which the request's TPOT carries over its output tokens.
* **Decision.** Admit when the predicted TTFT is within the class's share of its TTFT SLO and
  within the fill-wait limit, and the predicted ready wait within the decode-wait limit;
  otherwise a deferrable class is deferred (held, offered again each sample until its deadline),
  any other rejected - at arrival, before any prefill is spent - with the reason.
* **Integral correction** (the loop this closes: fill-queue work, and decode backlog, under
  delayed measurement). The top level's fill-wait and decode-wait limits are a setpoint plus a
  bias integrated from the measured (filtered) waits, so a steady prediction error (a fill
  rate or cache hit the model gets wrong) does not become a steady SLO miss. The bias moves
  only while its limit refuses requests, or downward (conditional integration).
* **Reservation** (a documented rule, not a loop). The top level's arrival rate lambda is
  filtered with the pool reconfiguration delay H as time constant (the rule follows demand at
  the time scale the pools could follow it); the capacity held is a quantile of its Poisson
  demand over the time that capacity is held: one fill step for the fill budget (z = 2.33; a
  step is never interrupted, every fill step keeps that share of its budget from lower levels)
  and the top level's decode time for decode slots (z = 0, its mean occupancy: lower levels
  plan on the slots the top level's expected occupancy leaves; they may borrow idle slots in the plant and are
  preempted when the top level needs them).

Plants without individual requests (the fluid plant, the pool model) use the rate this
controller returns: the fill room and decode room over ``gate_time_s`` plus the predicted
service rates, with the excess shed at arrival (``backlog_bound`` = one sample of it).

The linear model of the loop (:func:`slo_gate_loop`) and its tuning and checks
(:func:`tune_slo_admission`): with the gate acting within ``h`` on the predicted work, a
prediction gain error k (true / predicted tokens) and an integral gain ki on the measured
wait delayed by theta, the characteristic equation is h s + 1 + e^{-theta s} ((k - 1) + k ki
/ s) = 0, the loop L(s) = e^{-theta s} ((k - 1) s + k ki) / (s (h s + 1)) in negative feedback
(the ledger term is given the outer loop's delay, theta >= the measurement delay). SIMC for the
pure delay seen by the integral (Skogestad 2003, Table 1, tau1 -> 0): ki = 1 / (k (tau_c +
theta)), tau_c the first multiple of theta meeting the margin floors over the envelope.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field

import control

from tokenfactory.core.classes import DEFAULT_CLASSES, RequestClass, class_table
from tokenfactory.controllers.batch_gate import JOIN_WAIT_PASSES
from tokenfactory.controllers.describing import predict_limit_cycles
from tokenfactory.controllers.interface import SampledController, lowpass
from tokenfactory.controllers.stability import DelayedLoop, Margins, stability_margins
from tokenfactory.core.signals import ADMIT, AdmissionAction, Arrival, Decision, Measurement, ReserveAction
from tokenfactory.core.validation import ConfigError, check_number

__all__ = ["DEFAULT_TTFT_FRACTION", "SLOAwareAdmission", "GateLoopTuning", "slo_gate_loop", "tune_slo_admission", "reserve_share"]


#: share of the TTFT slack (the SLO less the request's own fill alone) its predicted TTFT may
#: use: the own fill is the service model's per-request figure (exact for a request alone in the
#: request simulator), so the margin covers the queue's prediction only. Measured in the overload
#: study (mooncake-conversation, SLO attainment at 0.6x / 0.9x): 0.8 gave 0.474 / 0.488, 0.9
#: 0.535 / 0.579, admitted requests meeting their SLO 1.000 in both; the Azure traces unchanged
DEFAULT_TTFT_FRACTION = 0.9


def reserve_share(rate_rps: float, window_s: float, z: float, unit_cost: float, capacity: float,
                  cap: float = 0.8) -> float:
    """Share of a capacity held for a class: the z-quantile of its Poisson demand in a window,
    (lambda w + z sqrt(lambda w)) requests, times what one costs, over the capacity.

    Parameters
    ----------
    rate_rps : float
        The class's (filtered) arrival rate (requests/s).
    window_s : float
        w, the window the capacity cannot be taken back within (s, > 0): a fill step for the fill
        budget (a step cannot be interrupted), the class's decode time for decode slots.
    z : float
        Quantile (standard normal; 2.33 for 99 %).
    unit_cost : float
        What one request needs of the capacity (fill: tokens; decode: one slot).
    capacity : float
        The capacity (fill: the step's token budget; decode: slots).
    cap : float
        Largest share held (default 0.8).

    Returns
    -------
    float
        The share in [0, ``cap``].
    """
    if capacity <= 0 or rate_rps <= 0 or window_s <= 0:
        return 0.0
    n = rate_rps * window_s
    return float(min(max((n + z * math.sqrt(n)) * unit_cost / capacity, 0.0), cap))


class SLOAwareAdmission(SampledController):
    """Admit, defer or reject each arrival on its predicted TTFT and decode wait (module notes).

    Parameters
    ----------
    fill_token_rate : float
        New prompt tokens/s one fill worker fills (roofline, full steps; > 0); the measured
        ``fill_token_capacity`` replaces it when the plant reports one.
    fill_step_s : float
        One full fill step (s, >= 0): the wait for the step in progress.
    fill_chunk_tokens : float
        New tokens of one request a fill step takes at most (its attention replica's share of the
        step's token budget; default inf): a longer prompt needs ceil(tokens / chunk) steps.
    kv_transfer_s : float
        KV transfer of the nominal request (s, >= 0).
    decode_pass_s : float
        Decode pass time the batch cap aims at (s, > 0): the per-token time of a decoding sequence
        (:func:`tokenfactory.controllers.batch_gate.pass_target_s`).
    prompt_tokens : float
        Nominal new prompt tokens of a request (> 0; converts the rate for fluid plants).
    output_tokens : mapping or float
        Expected output tokens per class name (or one number for every class; > 1).
    classes : iterable of RequestClass
        The classes and their SLOs (default :data:`tokenfactory.core.classes.DEFAULT_CLASSES`); the top
        priority class is the protected one.
    short_output_tokens : mapping or float, optional
        Output tokens of a short request per class (its TPOT carries its ready wait over fewer
        tokens): sets the decode-wait limit; default a quarter of ``output_tokens``.
    ttft_fraction : float
        Share of what a class's TTFT SLO leaves after the request's own fill alone that its
        predicted TTFT may use ((0, 1]; default :data:`DEFAULT_TTFT_FRACTION`).
    wait_target_fraction : float
        Setpoint of the top class's fill wait and decode wait as a share of their limits
        ((0, 1]; default 0.5).
    fill_ki, decode_ki : float
        Integral gains of the two limit corrections (1/s, >= 0; :func:`tune_slo_admission`).
    filter_tau_s : float
        Low-pass time constant of the measured waits (s, >= 0; default 0.5).
    cached_token_cost : float
        Fill cost of a cached prefix token relative to a new token (>= 0; default 0).
    reserve_horizon_s : float
        H, the time constant the reservation's demand estimate is filtered with (s, > 0; default
        150 = start-up 120 s + warm-up 30 s of :class:`tokenfactory.plant_models.fleet.PoolDynamics`,
        the pools' reconfiguration delay).
    reserve_z : float
        Quantile of the fill reservation (>= 0; default 2.33, 99 %; at most half of each step).
    decode_reserve_z : float
        Standard deviations above its mean of the top level's decode occupancy held for it
        (>= 0; default 0, the mean: borrowed slots are taken back by preemption, so more only
        turns lower-priority work away when there is room).
    completion_z : float
        Standard deviations of the Poisson completions over the prediction horizon kept in hand
        in the decode prediction (>= 0; default 2: a request counts only on the completions that
        come with 98 % probability - a TPOT SLO within 5 % of the pass time leaves a short
        request almost no ready wait).
    decode_reserve_s : float
        How far below zero the decode-wait limit may be corrected (s of completions in hand,
        >= 0; default 2).
    gate_time_s : float, optional
        h: the time the rate form (fluid plants) takes to fill the room (s; default the sample period).
    fill_time_s : callable, optional
        The request's own fill from the service model,
        ``fill_time_s(new_tokens, cached_tokens, step_floor_s=0.0, step_tokens=None) -> s``
        (:meth:`tokenfactory.plant_models.service.ServiceModel.request_fill_s`: its chunks, each
        chunk's step including its attention over the context before it). With it the own fill
        is the request's chunked fill alone on an idle fill pool, and in steps of the full budget
        lasting at least the busy step on a busy one; a request whose fill alone already misses
        its class's TTFT SLO is rejected at arrival (``infeasible_slo``, never deferred). None
        (default): one full step per chunk.
    batch_gate : BatchGate, optional
        A decode batch gate run at this controller's samples (its cap is returned with the
        admission actions); None (default): no batch control.
    sample_period : float
        Seconds between updates (> 0; default 0.25).
    """

    name = "slo-aware"

    def __init__(self, *, fill_token_rate: float, fill_step_s: float, kv_transfer_s: float, decode_pass_s: float,
                 prompt_tokens: float, output_tokens: Mapping[str, float] | float,
                 classes: Iterable[RequestClass] | None = None,
                 short_output_tokens: Mapping[str, float] | float | None = None,
                 ttft_fraction: float = DEFAULT_TTFT_FRACTION, wait_target_fraction: float = 0.5, fill_ki: float = 0.5,
                 decode_ki: float = 0.2, filter_tau_s: float = 0.5, cached_token_cost: float = 0.0,
                 reserve_horizon_s: float = 150.0, reserve_z: float = 2.33, decode_reserve_z: float = 0.0,
                 completion_z: float = 2.0,
                 decode_reserve_s: float = 2.0, gate_time_s: float | None = None,
                 batch_gate=None, sample_period: float = 0.25, fill_chunk_tokens: float = math.inf,
                 fill_time_s: Callable[..., float] | None = None):
        super().__init__(sample_period)
        w = "slo_aware"
        if fill_time_s is not None and not callable(fill_time_s):
            raise ConfigError(f"{w}.fill_time_s", "must be a callable (new tokens, cached tokens, ...) -> seconds")
        self.fill_time_s = fill_time_s
        self.fill_chunk_tokens = check_number(f"{w}.fill_chunk_tokens", fill_chunk_tokens, low=1.0, allow_inf=True)
        self.fill_token_rate = check_number(f"{w}.fill_token_rate", fill_token_rate, low=0.0, low_inclusive=False)
        self.fill_step_s = check_number(f"{w}.fill_step_s", fill_step_s, low=0.0)
        self.kv_transfer_s = check_number(f"{w}.kv_transfer_s", kv_transfer_s, low=0.0)
        self.decode_pass_s = check_number(f"{w}.decode_pass_s", decode_pass_s, low=0.0, low_inclusive=False)
        self.prompt_tokens = check_number(f"{w}.prompt_tokens", prompt_tokens, low=0.0, low_inclusive=False)
        self.classes = class_table(DEFAULT_CLASSES if classes is None else classes)
        names = list(self.classes)
        prios = sorted({c.priority for c in self.classes.values()})
        self.level = {n: prios.index(self.classes[n].priority) for n in names}
        self.top = names[0]
        self.out = self._per_class(f"{w}.output_tokens", output_tokens, low=1.0)
        short = ({n: 0.25 * self.out[n] for n in names} if short_output_tokens is None
                 else self._per_class(f"{w}.short_output_tokens", short_output_tokens, low=1.0))
        self.short_out = short
        self.ttft_fraction = check_number(f"{w}.ttft_fraction", ttft_fraction, low=0.0, high=1.0,
                                          low_inclusive=False)
        self.wait_target_fraction = check_number(f"{w}.wait_target_fraction", wait_target_fraction, low=0.0,
                                                 high=1.0, low_inclusive=False)
        self.fill_ki = check_number(f"{w}.fill_ki", fill_ki, low=0.0)
        self.decode_ki = check_number(f"{w}.decode_ki", decode_ki, low=0.0)
        self.filter_tau_s = check_number(f"{w}.filter_tau_s", filter_tau_s, low=0.0)
        self.cached_token_cost = check_number(f"{w}.cached_token_cost", cached_token_cost, low=0.0)
        self.reserve_horizon_s = check_number(f"{w}.reserve_horizon_s", reserve_horizon_s, low=0.0,
                                              low_inclusive=False)
        self.reserve_z = check_number(f"{w}.reserve_z", reserve_z, low=0.0)
        self.completion_z = check_number(f"{w}.completion_z", completion_z, low=0.0)
        self.decode_reserve_z = check_number(f"{w}.decode_reserve_z", decode_reserve_z, low=0.0)
        self.decode_reserve_s = check_number(f"{w}.decode_reserve_s", decode_reserve_s, low=0.0)
        self.gate_time_s = sample_period if gate_time_s is None else check_number(
            f"{w}.gate_time_s", gate_time_s, low=0.0, low_inclusive=False)
        self.batch_gate = batch_gate
        # limits of the top class: the fill wait may use its TTFT share less one step; the decode
        # wait what its TPOT leaves a short request of k tokens after its transfer, the wait to
        # join (up to JOIN_WAIT_PASSES passes) and k - 1 passes: (SLO - pass) (k - 1) - transfer - pass
        top = self.classes[self.top]
        self.fill_limit_max = max(self.ttft_fraction * top.slo_ttft_s - self.fill_step_s, 0.0)
        p = self.decode_pass_s
        self.decode_limit_max = {n: max((self.classes[n].slo_tpot_s - p) * (self.short_out[n] - 1.0)
                                        - self.kv_transfer_s - JOIN_WAIT_PASSES * p, 0.0) for n in names}
        self.fill_target = self.wait_target_fraction * self.fill_limit_max
        self.decode_target = self.wait_target_fraction * self.decode_limit_max[self.top]
        self.reset()

    def _per_class(self, field_name: str, v, low: float) -> dict[str, float]:
        if isinstance(v, Mapping):
            out = {}
            for n in self.classes:
                if n not in v:
                    raise ConfigError(f"{field_name}.{n}", "missing for this class")
                out[n] = check_number(f"{field_name}.{n}", v[n], low=low)
            return out
        x = check_number(field_name, v, low=low)
        return {n: x for n in self.classes}

    # -- state ----------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the plant: no measurement, empty ledger, no bias, nothing reserved."""
        self.m: Measurement | None = None
        self.ledger: deque = deque()     # (time, class, tokens) admitted and not yet in a measurement
        self.led_tokens = {n: 0.0 for n in self.classes}
        self.led_count = {n: 0 for n in self.classes}
        self.fill_bias = 0.0
        self.decode_bias = 0.0
        self.fill_wait_f: float | None = None
        self.decode_wait_f: float | None = None
        self.top_rate_f: float | None = None
        self.rate_samples = 0
        self.fill_share = 0.0
        self.decode_share = 0.0
        self.decode_reserve = 0.0
        self.refused = {"fill": 0, "decode": 0}
        self.decisions = {"admit": 0, "defer": 0, "reject": 0}
        self.last_fill_wait = 0.0
        if self.batch_gate is not None:
            self.batch_gate.reset()

    # -- what the plant looks like now ----------------------------------------------------
    def _mu(self) -> float:
        m = self.m
        if m is not None and m.fill_token_capacity == m.fill_token_capacity and m.fill_token_capacity > 0:
            return m.fill_token_capacity
        workers = m.fill_workers if m is not None and m.fill_workers == m.fill_workers else 1.0
        return self.fill_token_rate * max(workers, 1.0)

    def _class_state(self, name: str) -> tuple[float, float, float, float]:
        """(fill tokens queued, active, ready, in fill) of a class, as last measured."""
        m = self.m
        cl = m.classes.get(name) if m.classes else None
        if cl is not None:
            return cl.fill_queued_tokens, cl.active_decodes, cl.ready, cl.fill_in_progress
        if name != self.top:  # a plant without classes: everything is the top class
            return 0.0, 0.0, 0.0, 0.0
        tok = m.fill_queued_tokens if m.fill_queued_tokens == m.fill_queued_tokens else \
            m.fill_in_progress * self.prompt_tokens
        return tok, m.active_decodes, m.ready, m.fill_in_progress

    def _pass_s(self) -> float:
        m = self.m
        y = m.decode_pass_s if m is not None else math.nan
        return y if y == y and y > 0 else self.decode_pass_s

    @property
    def fill_step_tokens(self) -> float:
        """New tokens of a full fill step (the token rate times the step)."""
        return self.fill_token_rate * self.fill_step_s

    def _fill_busy(self) -> bool:
        """Requests in fill, as last measured or admitted since."""
        m = self.m
        fip = m.fill_in_progress if m.fill_in_progress == m.fill_in_progress else 0.0
        return fip + sum(self.led_count.values()) > 0

    def solo_fill_s(self, a: Arrival) -> float:
        """Arrival ``a``'s own fill alone on an idle fill pool (s): its TTFT on an empty cluster
        (``fill_time_s``; without it one nominal step per chunk).

        Parameters
        ----------
        a : Arrival
            The request.

        Returns
        -------
        float
            Seconds.
        """
        if self.fill_time_s is not None:
            return self.fill_time_s(a.prompt_tokens, a.cached_tokens)
        steps = math.ceil(a.prompt_tokens / self.fill_chunk_tokens) if a.prompt_tokens > 0 else 1
        return steps * self.fill_step_s

    def predict(self, t: float, a: Arrival) -> tuple[float, float]:
        """(predicted TTFT, predicted ready-buffer wait) of arrival ``a`` admitted at ``t`` (s).

        Parameters
        ----------
        t : float
            Now (s).
        a : Arrival
            The request.

        Returns
        -------
        tuple of float
            Time to first token from now, and the wait for a decode slot after its KV lands
            with ``completion_z`` standard deviations of the completions kept in hand (negative:
            that many seconds of decode completions to spare).
        """
        m = self.m
        lvl = self.level.get(a.request_class, len(self.level))
        age = max(t - m.time_s, 0.0)
        mu = self._mu()
        pass_s = self._pass_s()
        work = 0.0
        occ = [0.0, 0.0]     # sequences that will hold or wait for a slot: top level, the levels below up to lvl
        active = [0.0, 0.0]
        for n, l in self.level.items():
            if l <= lvl:
                tok, act, rdy, fip = self._class_state(n)
                work += tok + self.led_tokens[n]
                j = 0 if l == 0 else 1
                occ[j] += act + rdy + fip + self.led_count[n]
                active[j] += act
        rate = mu if lvl == 0 else mu * (1.0 - self.fill_share)
        work = max(work - rate * age, 0.0)
        x = a.prompt_tokens + self.cached_token_cost * a.cached_tokens
        # a full step lasts as long as the measured token rate says (chunks' attention included)
        workers = m.fill_workers if m.fill_workers == m.fill_workers and m.fill_workers > 0 else 1.0
        step = self.fill_step_s * max(1.0, self.fill_token_rate * workers / mu) if mu > 0 else self.fill_step_s
        if self.fill_time_s is None:
            # its own fill: one step per chunk (a replica's share of a step) once steps are full
            steps = math.ceil(a.prompt_tokens / self.fill_chunk_tokens) if a.prompt_tokens > 0 else 1
            own = max(x / rate, (steps - 1) * step) + step
        elif work > 0 or self._fill_busy():
            # a busy pool: its chunks share full steps (each at least the busy step, longer when
            # its own chunk's attention over its context is the step's largest), after the step in
            # progress
            own = max(x / rate + step, self.fill_time_s(a.prompt_tokens, a.cached_tokens, step_floor_s=step,
                                                         step_tokens=self.fill_step_tokens))
        else:  # an idle pool: its chunks alone
            own = self.fill_time_s(a.prompt_tokens, a.cached_tokens)
        self.last_fill_wait = work / rate
        ttft = work / rate + own
        horizon = ttft + self.kv_transfer_s
        # decode: the top level may take every slot (lower levels are preempted for it); a lower
        # level gets the slots the top level neither holds nor has reserved
        slots = m.decode_slots
        seq_top = pass_s * self.out[self.top]
        free_top = min(active[0], slots) / seq_top if seq_top > 0 else math.inf
        occ_top = max(occ[0] - free_top * age, 0.0)
        if lvl == 0:
            occ_j, free_j, avail, seq_s = occ_top, free_top, slots, seq_top
        else:
            seq_s = pass_s * self.out.get(a.request_class, self.out[self.top])
            avail = slots - max(occ_top, self.decode_reserve)
            free_j = min(active[1], max(avail, 0.0)) / seq_s if seq_s > 0 else math.inf
            occ_j = max(occ[1] - free_j * age, 0.0)
        ahead = occ_j + 1.0 - avail - free_j * horizon
        # completions are a Poisson stream: keep z standard deviations of them over the horizon in hand
        ahead += self.completion_z * math.sqrt(free_j * (age + horizon)) if free_j < math.inf else 0.0
        # the rate its wait drains at: every slot's completions for the top level; for a lower level
        # only the slots the top level leaves (what completes on the others goes to the top level
        # first - measured on azure-conv-2023 at 0.9x: with every slot's rate, admitted batch
        # requests waited 40 s in the ready buffer behind interactive ones)
        full_rate = max(slots if lvl == 0 else avail, 1.0) / seq_s if seq_s > 0 else math.inf
        wait = ahead / full_rate if full_rate > 0 else math.inf
        return ttft, wait

    # -- the gate -------------------------------------------------------------------------
    def decide(self, t: float, a: Arrival) -> Decision:
        """Admit, defer or reject arrival ``a`` (the request simulator calls this per arrival).

        Parameters
        ----------
        t : float
            Now (s).
        a : Arrival
            What the orchestrator knows of the request.

        Returns
        -------
        Decision
            ``admit``; else ``defer`` (a deferrable class) or ``reject`` with
            ``predicted_slo_violation`` (TTFT) or ``decode_overloaded`` (ready wait).
        """
        if self.m is None:  # no measurement yet: the plant is empty
            self._admitted(t, a)
            return ADMIT
        name = a.request_class if a.request_class in self.classes else self.top
        c = self.classes[name]
        solo = self.solo_fill_s(a)
        if solo > c.slo_ttft_s:  # its own fill misses the SLO whatever the queue: no prefill spent on it
            self.decisions["reject"] += 1
            return Decision("reject", "infeasible_slo")
        ttft, wait = self.predict(t, a)
        elapsed = max(t - a.arrived_s, 0.0)
        # the ttft_fraction margin covers the queue's uncertainty, not the request's own fill (known
        # from the service model): the SLO less (1 - fraction) of what its own fill leaves
        ttft_ok = elapsed + ttft <= c.slo_ttft_s - (1.0 - self.ttft_fraction) * (c.slo_ttft_s - solo)
        decode_limit = self.decode_limit_max[name]
        if name == self.top:
            ttft_ok = ttft_ok and self.last_fill_wait <= self.fill_limit()
            decode_limit = self.decode_limit()
        if ttft_ok and wait <= decode_limit:
            self._admitted(t, a)
            return ADMIT
        reason = "predicted_slo_violation" if not ttft_ok else "decode_overloaded"
        self.refused["fill" if not ttft_ok else "decode"] += name == self.top
        verdict = "defer" if c.deferrable and elapsed < c.max_defer_s else "reject"
        self.decisions[verdict] += 1
        return Decision(verdict, reason)

    def _admitted(self, t: float, a: Arrival) -> None:
        name = a.request_class if a.request_class in self.classes else self.top
        x = a.prompt_tokens + self.cached_token_cost * a.cached_tokens
        self.ledger.append((t, name, x))
        self.led_tokens[name] += x
        self.led_count[name] += 1
        self.decisions["admit"] += 1

    def fill_limit(self) -> float:
        """The top class's fill-wait limit now (s): setpoint + bias, within [0, its TTFT share]."""
        return min(max(self.fill_target + self.fill_bias, 0.0), self.fill_limit_max)

    def decode_limit(self) -> float:
        """The top class's decode-wait limit now (s): setpoint + bias, at most its TPOT slack (a
        negative limit asks for that many seconds of completions in hand)."""
        return min(self.decode_target + self.decode_bias, self.decode_limit_max[self.top])

    # -- the sampled part -----------------------------------------------------------------
    def update(self, t: float, m: Measurement):
        """Take a measurement: trim the ledger, correct the limits, set the reservation.

        Parameters
        ----------
        t : float
            Plant time (s).
        m : Measurement
            The (delayed) sample.

        Returns
        -------
        list
            ``[AdmissionAction, ReserveAction]`` (and the batch gate's
            :class:`~tokenfactory.core.signals.BatchCapAction` when there is one): the rate form of
            the gate (for plants without per-request arrivals; excess shed at arrival, reason
            ``predicted_slo_violation``) and the capacity held for the top class.
        """
        T = self.sample_period
        self.m = m
        while self.ledger and self.ledger[0][0] <= m.time_s:  # now part of the measurement
            _, n, x = self.ledger.popleft()
            self.led_tokens[n] -= x
            self.led_count[n] -= 1
        # measured waits of the top class (filtered) and the integral corrections
        tok, act, rdy, fip = self._class_state(self.top)
        mu = self._mu()
        cl = m.classes.get(self.top) if m.classes else None
        fill_wait = cl.predicted_wait_s if cl is not None else tok / mu
        seq_s = self._pass_s() * self.out[self.top]
        slots = m.decode_slots
        # the measured counterpart of the predicted decode wait, signed: sequences beyond the slots
        # (waiting) or short of them (spare, negative) over the slots' completion rate
        ready_wait = (act + rdy - slots) / (slots / seq_s) if slots > 0 and seq_s > 0 else 0.0
        self.fill_wait_f = lowpass(self.fill_wait_f, fill_wait, self.filter_tau_s, T)
        self.decode_wait_f = lowpass(self.decode_wait_f, ready_wait, self.filter_tau_s, T)
        ef = self.fill_target - self.fill_wait_f
        if self.refused["fill"] > 0 or ef < 0:  # conditional integration
            self.fill_bias = min(max(self.fill_bias + self.fill_ki * T * ef, -self.fill_target),
                                 self.fill_limit_max - self.fill_target)
        ed = self.decode_target - self.decode_wait_f
        if self.refused["decode"] > 0 or ed < 0:
            self.decode_bias = min(max(self.decode_bias + self.decode_ki * T * ed, -self.decode_target - self.decode_reserve_s),
                                   self.decode_limit_max[self.top] - self.decode_target)
        self.refused = {"fill": 0, "decode": 0}
        # reservation for the top class: its demand's quantile over the reconfiguration delay
        top_rate = cl.arrival_rate if cl is not None else (m.arrival_rate if m.arrival_rate == m.arrival_rate
                                                           else m.admitted_rate)
        # filtered with time constant H, as a running mean while fewer than H seconds are measured
        self.rate_samples += 1
        self.top_rate_f = lowpass(self.top_rate_f, top_rate, min(self.reserve_horizon_s,
                                                                        self.rate_samples * T), T)
        if len(self.classes) > 1:
            workers = m.fill_workers if m.fill_workers == m.fill_workers and m.fill_workers > 0 else 1.0
            self.fill_share = reserve_share(self.top_rate_f / workers, self.fill_step_s, self.reserve_z,
                                            self.prompt_tokens, mu / workers * self.fill_step_s, cap=0.5)
            # the top level's occupancy quantile (Poisson, mean lambda x its decode time): lower
            # levels plan on the slots it leaves
            n = max(self.top_rate_f * seq_s, 0.0)
            self.decode_reserve = n + self.decode_reserve_z * math.sqrt(n)
            self.decode_share = min(self.decode_reserve / slots, 1.0) if slots > 0 else 0.0
        out = [self.rate_action(t), ReserveAction(self.fill_share, self.decode_share, self.top)]
        if self.batch_gate is not None:
            out.append(self.batch_gate.update(t, m))
        return out

    def rate_action(self, t: float) -> AdmissionAction:
        """The gate as a rate (plants without per-request arrivals): the nominal request's room
        in fill and decode over ``gate_time_s`` plus the service rates, the excess shed.

        Parameters
        ----------
        t : float
            Now (s).

        Returns
        -------
        AdmissionAction
            ``rate`` (requests/s), ``backlog_bound`` one sample of it, reason
            ``predicted_slo_violation``.
        """
        m, h = self.m, self.gate_time_s
        nominal = Arrival(self.top, int(round(self.prompt_tokens)), 0, self.out[self.top], t)
        ttft, wait = self.predict(t, nominal)
        mu = self._mu() / self.prompt_tokens
        seq_s = self._pass_s() * self.out[self.top]
        full = m.decode_slots / seq_s if seq_s > 0 else math.inf
        room_fill = (self.fill_limit() - self.last_fill_wait) * mu
        room_decode = (self.decode_limit() - wait) * full
        rate = max(min(mu + room_fill / h, full + room_decode / h), 0.0)
        return AdmissionAction(rate, rate * self.sample_period, "predicted_slo_violation")

    def params(self) -> dict:
        return {"fill_token_rate": self.fill_token_rate, "fill_step_s": self.fill_step_s,
                "fill_chunk_tokens": self.fill_chunk_tokens,
                "kv_transfer_s": self.kv_transfer_s, "decode_pass_s": self.decode_pass_s,
                "prompt_tokens": self.prompt_tokens, "output_tokens": self.out, "short_output_tokens": self.short_out,
                "classes": [asdict(c) for c in self.classes.values()], "ttft_fraction": self.ttft_fraction,
                "wait_target_fraction": self.wait_target_fraction, "fill_ki": self.fill_ki,
                "decode_ki": self.decode_ki, "filter_tau_s": self.filter_tau_s,
                "cached_token_cost": self.cached_token_cost, "reserve_horizon_s": self.reserve_horizon_s,
                "reserve_z": self.reserve_z, "decode_reserve_z": self.decode_reserve_z,
                "completion_z": self.completion_z,
                "decode_reserve_s": self.decode_reserve_s, "gate_time_s": self.gate_time_s, "sample_period": self.sample_period,
                "fill_time_s": getattr(self.fill_time_s, "__qualname__", None),
                "batch_gate": self.batch_gate.params() if self.batch_gate is not None else None}


# ------------------------------------------------------------------------------------------
# the loop's linear model, tuning and checks


def slo_gate_loop(ki: float, theta_s: float, gate_time_s: float, *, gain_factor: float = 1.0,
                  name: str = "slo gate") -> DelayedLoop:
    """L(s) = e^{-theta s} ((k - 1) s + k ki) / (s (h s + 1)): the gate acting within h on the
    predicted work, the integral correction ki on the measured wait delayed by theta, a
    prediction gain error k (see the module notes for the derivation).

    Parameters
    ----------
    ki : float
        Integral gain (1/s).
    theta_s : float
        Effective delay of the measured wait (s).
    gate_time_s : float
        h (s).
    gain_factor : float
        k, true over predicted work per admitted request (1: exact).
    name : str
        The loop's name.

    Returns
    -------
    DelayedLoop
    """
    k = gain_factor
    R = control.tf([k - 1.0, k * ki], [gate_time_s, 1.0, 0.0])
    return DelayedLoop(R, theta_s, name)


@dataclass
class GateLoopTuning:
    """One gate loop's tuning: delays, gains, margins over the envelope, describing-function check.

    Attributes
    ----------
    loop : str
        ``"fill"`` or ``"decode"``.
    theta_s, gate_time_s, tau_c_s, ki : float
        Effective delay, gate time h, SIMC closed-loop time constant and integral gain.
    nominal : Margins
        Margins at the nominal point.
    envelope : list of dict
        Rows ``delay_factor``, ``gain_factor``, the verdict, margins and ``meets_floors``.
    limit_cycle : dict or None
        The describing-function prediction for the saturated limit (None: no cycle).
    """

    loop: str
    theta_s: float
    gate_time_s: float
    tau_c_s: float
    ki: float
    nominal: Margins
    envelope: list = field(default_factory=list)
    limit_cycle: dict | None = None

    @property
    def envelope_ok(self) -> bool:
        """Every envelope point stable and meeting the floors."""
        return all(r["meets_floors"] for r in self.envelope)

    @property
    def worst(self) -> dict:
        """The envelope point with the smallest |PM| (an unstable one first)."""
        return min(self.envelope, key=lambda r: (r["stable"], abs(r["phase_margin_deg"]), r["gain_margin"]))

    def to_dict(self) -> dict:
        """Plain figures."""
        d = asdict(self)
        d["nominal"] = self.nominal.to_dict()
        d["envelope_ok"] = self.envelope_ok
        return d


def tune_slo_admission(theta_fill_s: float, theta_decode_s: float, gate_time_s: float, *,
                       delay_factors=(0.5, 1.0, 2.0), gain_factors=(0.7, 1.0, 1.3), gm_floor: float = 2.0,
                       pm_floor_deg: float = 45.0, limit_range: float = 1.0,
                       tau_c_factors=(1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0)) -> dict[str, GateLoopTuning]:
    """SIMC-tune the fill and decode limit corrections and check them.

    For each loop: ki = 1 / (tau_c + theta) with tau_c the first of ``tau_c_factors`` x theta for
    which :func:`slo_gate_loop` is stable with GM >= ``gm_floor`` and |PM| >= ``pm_floor_deg`` at
    every (delay factor, gain factor) point; then the describing function of a saturation of
    half-width ``limit_range`` (the limit's clamp, in the loop's units) on the nominal loop.

    Parameters
    ----------
    theta_fill_s : float
        Effective delay of the measured fill wait: measurement delay + half a sample + filter
        constant + h (s).
    theta_decode_s : float
        Effective delay of the measured ready wait: the fill one plus the fill-to-ready time at
        the setpoint (s).
    gate_time_s : float
        h (s).
    delay_factors, gain_factors : sequence of float
        The envelope.
    gm_floor, pm_floor_deg : float
        Margin floors.
    limit_range : float
        Half-width of the clamp for the describing-function check.
    tau_c_factors : sequence of float
        Candidates.

    Returns
    -------
    dict
        ``{"fill": GateLoopTuning, "decode": GateLoopTuning}``.

    Raises
    ------
    ConfigError
        When no candidate meets the floors for a loop.
    """
    out = {}
    for loop, theta in (("fill", theta_fill_s), ("decode", theta_decode_s)):
        check_number(f"tuning.theta_{loop}_s", theta, low=0.0, low_inclusive=False)
        for f in tau_c_factors:
            ki = 1.0 / (f * theta + theta)
            rows = []
            for d in delay_factors:
                for k in gain_factors:
                    mg = stability_margins(slo_gate_loop(ki, theta * d, gate_time_s, gain_factor=k))
                    rows.append({"delay_factor": d, "gain_factor": k, **mg.to_dict(),
                                 "meets_floors": mg.meets(gm_floor, pm_floor_deg)})
            if all(r["meets_floors"] for r in rows):
                nominal_loop = slo_gate_loop(ki, theta, gate_time_s, name=f"{loop} gate")
                cycles = predict_limit_cycles(nominal_loop, control.saturation_nonlinearity(limit_range))
                out[loop] = GateLoopTuning(loop, theta, gate_time_s, f * theta, ki, stability_margins(nominal_loop),
                                           rows, cycles[0].to_dict() if cycles else None)
                break
        else:
            raise ConfigError(f"tuning.{loop}", f"no tau_c up to {tau_c_factors[-1]} x theta meets GM >= "
                              f"{gm_floor} and PM >= {pm_floor_deg} deg over the envelope")
    return out
