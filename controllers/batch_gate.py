"""Gated decode batch-size control (article section 18: "avoid changing the batch size before the
system can observe its effect"; large-batch recovery "may make the loop worse by increasing KV
memory pressure and response latency").

The decode batch cap is a control input (:class:`tokenfactory.core.signals.BatchCapAction`).
:class:`BatchGate` sets it to the largest batch whose predicted pass time - the roofline pass
time at the *live* context of the decoding sequences - meets a target share of the TPOT SLO,
with an integral correction of the model from the measured pass time:

    cap = B*(target - bias, context),   B*(y, c) = max { B : pass(B, c) <= y }
    bias <- bias + g (measured pass - target)      (only while the cap binds the batch)

Gated, an error between minus one sequence's pass-time step and zero is the whole-sequence cap's
resolution and is not integrated: otherwise the integral toggles the cap between neighbouring
batches every few holds (a quantisation cycle - 131 changes in 21 minutes in the layered-stack
study's request-simulator run before this rule, 20 after).

Through the model's inverse the loop from the corrected target to the measured pass time has
gain 1 (the ratio of the true to the modelled slope) and a delay: the measurement delay, one
decode pass until sequences join and leave, half a snapshot. **Gated** (default), a change is
made only once a measurement taken at least one pass after the previous change is in hand
(``m.time_s`` past the change plus one pass: the effect is observable) and, after a lowering,
once the measured batch has come down to the new cap (sequences are not evicted; the batch
shrinks as they complete, over a decode time); the correction gain ``g`` is SIMC-tuned for that
loop (:func:`tune_batch_gate`). **Ungated** (``gated=False``)
the same rule acts at every sample with ``g = 1`` - correct the whole latest error at once, what
an engine adjusting its batch size every scheduler iteration from the latest latency does. A
raised cap fills within a pass from the ready buffer, a lowered one empties only as sequences
complete, so the rule keeps cutting while the batch drains, overshoots to small batches, then
recovers with a large batch all at once from the waiting work (the "large-batch recovery" of
section 18): with the loop delay several samples long and the batch's response a decode time
long, the loop is unstable and the cap swings between small batches and the KV limit, the pass
time with it (the limit cycle the describing function of the cap's saturation predicts,
:func:`batch_gate_loop` / :func:`predict_batch_cycle`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import control
import numpy as np
from scipy.optimize import brentq

from tokenfactory.controllers.describing import LimitCycle
from tokenfactory.controllers.envelope_tuner import SIMC_TAU_C_FACTORS, simc_search
from tokenfactory.controllers.interface import SampledController
from tokenfactory.controllers.stability import (  # the phase crossovers: where a real N(A) can balance
    DelayedLoop,
    Margins,
    phase_crossovers,
    loop_transfer,
    stability_margins,
)
from tokenfactory.core.signals import BatchCapAction, Measurement
from tokenfactory.core.validation import REQUIRED, ConfigError, check_fields, check_number, setting

__all__ = ["BatchGateConfig", "BatchGate", "BatchGateTuning", "batch_gate_delay", "batch_gate_loop", "tune_batch_gate",
           "predict_batch_cycle", "largest_batch", "pass_target_s", "JOIN_WAIT_PASSES"]


#: passes a ready sequence may wait to join a decode batch: it joins at the next pass boundary,
#: so the wait is anywhere in [0, one pass]. Planning on the mean (half a pass) lets about half
#: of the short requests miss: measured in the overload study, 2.3 % of the admitted requests
#: of azure-code-2023 at 0.6x missed their TPOT, every one with 6-9 output tokens (the trace's
#: 5 % quantile is 6); planning on the whole pass meets it for every request of k tokens or more
JOIN_WAIT_PASSES = 1.0


def pass_target_s(slo_tpot_s: float, tpot_fraction: float, short_output_tokens: float | None = None,
                  kv_transfer_s: float = 0.0, join_wait_passes: float = JOIN_WAIT_PASSES) -> float:
    """The decode pass time a batch cap should aim at (s): ``tpot_fraction`` x the TPOT SLO, and
    no more than lets a short request of k output tokens meet the SLO - its TPOT is (KV transfer
    + the wait to join the batch + (k - 1) passes) / (k - 1), the wait at most
    ``join_wait_passes`` passes (:data:`JOIN_WAIT_PASSES`).

    Parameters
    ----------
    slo_tpot_s : float
        The TPOT SLO (s).
    tpot_fraction : float
        Share of the SLO a pass may take.
    short_output_tokens : float, optional
        k (>= 2); None: no short-request bound.
    kv_transfer_s : float
        The KV transfer a request's TPOT carries (s).
    join_wait_passes : float
        Passes its wait to join the batch may last (>= 0; default :data:`JOIN_WAIT_PASSES`).

    Returns
    -------
    float
        The target (s, > 0 unless even a zero-length pass misses the SLO).
    """
    check_number("join_wait_passes", join_wait_passes, low=0.0)
    t = tpot_fraction * slo_tpot_s
    if short_output_tokens is not None:
        k = short_output_tokens
        t = min(t, (slo_tpot_s * (k - 1.0) - kv_transfer_s) / (k - 1.0 + join_wait_passes))
    return max(t, 1e-6)


def largest_batch(pass_time_s: Callable[[float, float], float], target_s: float, context_tokens: float,
                  max_batch: float, min_batch: float = 1.0) -> float:
    """The largest batch in [min_batch, max_batch] whose pass time at ``context_tokens`` is at
    most ``target_s`` (pass time increases with the batch; bisection to a tenth of a sequence).

    Parameters
    ----------
    pass_time_s : callable
        ``pass_time_s(batch, context_tokens) -> s``, increasing in ``batch``.
    target_s : float
        The pass time allowed (s).
    context_tokens : float
        Mean context of the batch (tokens).
    max_batch, min_batch : float
        The range searched (sequences).

    Returns
    -------
    float
        The batch (``min_batch`` when even that is too slow, ``max_batch`` when that is fast
        enough).
    """
    if pass_time_s(max_batch, context_tokens) <= target_s:
        return float(max_batch)
    if pass_time_s(min_batch, context_tokens) > target_s:
        return float(min_batch)
    lo, hi = float(min_batch), float(max_batch)
    while hi - lo > 0.5:
        mid = 0.5 * (lo + hi)
        if pass_time_s(mid, context_tokens) <= target_s:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class BatchGateConfig:
    """Everything :class:`BatchGate` is built from but its pass-time model (validated here, fields
    named ``batch_gate.FIELD``; the registry's :func:`tokenfactory.registry.batch_gate_for` resolves
    it from a plant). The defaults are declared here only.

    Parameters
    ----------
    slo_tpot_s : float
        The TPOT SLO (s, > 0).
    max_batch : float
        Largest cap (sequences per worker; the KV slots at the nominal context, >= 1).
    nominal_context_tokens : float
        Context used while nothing decodes (tokens, > 0).
    tpot_fraction : float
        Share of the SLO a pass may take (the rest is for ready-buffer waits and the spread of
        contexts; (0, 1], default 0.95).
    gain : float
        Share of the measured error corrected per change (g, (0, 2]; default 0.35, the SIMC gain
        of :func:`tune_batch_gate` at the default plant).
    gated : bool
        Hold every change until its effect is observable (default True; False acts every sample).
    settle_passes : float
        Passes after a change before a measurement shows it (>= 0; default 1).
    min_batch : float
        Smallest cap (sequences, in [1, ``max_batch``]; default 1).
    short_output_tokens : float, optional
        Output tokens of a short request (a low quantile of the outputs, >= 2): its TPOT is
        (KV transfer + half a pass waiting to join + (k - 1) passes) / (k - 1), so the target is
        also at most (SLO (k - 1) - transfer) / (k - 1/2). Default None: no such bound.
    kv_transfer_s : float
        KV transfer time a request's TPOT carries (s, >= 0; default 0).
    context_tau_s : float
        Time constant of the low-pass on the measured context (s, >= 0; default 5): the cap
        follows the context's drift, not the joining and leaving of single long prompts.
    drain_timeout_s : float
        Gated, after lowering the cap the gate waits until the measured batch has come down to
        it (nobody is evicted: the batch shrinks as sequences complete), at most this long (s,
        > 0; default 60).
    sample_period : float
        Seconds between updates (> 0; default 0.1).

    Raises
    ------
    ConfigError
        For a value out of its range.
    """

    slo_tpot_s: float = setting(REQUIRED, unit="s", low=0.0, low_inclusive=False, meaning="the TPOT SLO")
    max_batch: float = setting(REQUIRED, unit="sequences", low=1.0,
                               meaning="largest cap per worker (the KV slots at the nominal context)")
    nominal_context_tokens: float = setting(REQUIRED, unit="tokens", low=0.0, low_inclusive=False,
                                            meaning="context used while nothing decodes")
    tpot_fraction: float = setting(0.95, low=0.0, high=1.0, low_inclusive=False,
                                   meaning="share of the TPOT SLO a decode pass may take")
    gain: float = setting(0.35, low=0.0, high=2.0, low_inclusive=False,
                          meaning="share of the measured error corrected per change (the SIMC gain of "
                                  "tune_batch_gate at the default plant)")
    gated: bool = setting(True, kind=bool, meaning="hold every change until its effect is observable")
    settle_passes: float = setting(1.0, low=0.0, meaning="passes after a change before a measurement shows it")
    min_batch: float = setting(1.0, unit="sequences", low=1.0, meaning="smallest cap (at most max_batch)")
    short_output_tokens: float | None = setting(None, unit="tokens", low=2.0,
                                                meaning="output tokens of a short request (absent: no "
                                                        "short-request bound on the target)")
    kv_transfer_s: float = setting(0.0, unit="s", low=0.0, meaning="KV transfer time a request's TPOT carries")
    context_tau_s: float = setting(5.0, unit="s", low=0.0, meaning="low-pass time constant of the measured context")
    drain_timeout_s: float = setting(60.0, unit="s", low=0.0, low_inclusive=False,
                                     meaning="longest wait for the batch to come down to a lowered cap")
    sample_period: float = setting(0.1, unit="s", low=0.0, low_inclusive=False, meaning="seconds between updates")

    def __post_init__(self) -> None:  # checked once against the declarations, held as the floats the gate computes with
        check_fields(self, "batch_gate", names=("slo_tpot_s", "tpot_fraction", "max_batch"))
        check_fields(self, "batch_gate", names=("min_batch", "nominal_context_tokens", "gain"),
                     bounds={"min_batch": {"high": self.max_batch}})
        object.__setattr__(self, "gated", bool(self.gated))
        check_fields(self, "batch_gate", names=("settle_passes", "short_output_tokens", "kv_transfer_s",
                                                "context_tau_s", "drain_timeout_s", "sample_period"))


class BatchGate(SampledController):
    """The decode batch cap from the roofline at the live context, corrected by the measured pass
    time, changed only when the previous change's effect has been observed (see the module notes).

    Parameters
    ----------
    pass_time_s : callable
        ``pass_time_s(batch_per_worker, context_tokens) -> s``: the model's decode pass time (for
        the request simulator :meth:`DESParams.decode_pass`, for the fluid plants the pass-time
        table over batch).
    config : BatchGateConfig
        The gate's parameters.

    Raises
    ------
    ConfigError
        For a config that is not a :class:`BatchGateConfig` (its fields are checked when it is made).
    """

    name = "batch-gate"

    def __init__(self, pass_time_s: Callable[[float, float], float], config: BatchGateConfig):
        if not isinstance(config, BatchGateConfig):
            raise ConfigError("batch_gate.config", "must be a BatchGateConfig")
        super().__init__(config.sample_period)
        self.config = c = config
        self.pass_time_s = pass_time_s
        (self.slo_tpot_s, self.tpot_fraction, self.max_batch, self.min_batch, self.nominal_context_tokens,
         self.gain, self.gated, self.settle_passes, self.short_output_tokens, self.kv_transfer_s, self.context_tau_s,
         self.drain_timeout_s) = (c.slo_tpot_s, c.tpot_fraction, c.max_batch, c.min_batch, c.nominal_context_tokens,
                                  c.gain, c.gated, c.settle_passes, c.short_output_tokens, c.kv_transfer_s,
                                  c.context_tau_s, c.drain_timeout_s)
        self.target_s = pass_target_s(self.slo_tpot_s, self.tpot_fraction, self.short_output_tokens,
                                      self.kv_transfer_s)
        self.reset()

    def initial_cap(self) -> float:
        """The cap before any measurement: the model's batch at the target and the nominal context."""
        return largest_batch(self.pass_time_s, self.target_s, self.nominal_context_tokens, self.max_batch,
                             self.min_batch)

    def reset(self) -> None:
        """Back to the model's cap at the nominal context, no correction, no change pending."""
        self.bias = 0.0
        self.cap = self.initial_cap()
        self.changed_at = -math.inf
        self.lowered = False
        self.changes = 0
        self.context_f: float | None = None

    def update(self, t: float, m: Measurement) -> BatchCapAction:
        """The cap for the next period.

        Parameters
        ----------
        t : float
            Plant time (s).
        m : Measurement
            The (delayed) sample; uses ``decode_pass_s``, ``decode_context_tokens``,
            ``active_decodes``, ``decode_workers`` and ``time_s``.

        Returns
        -------
        BatchCapAction
            The cap in force (unchanged while a change waits to be observed).
        """
        y = m.decode_pass_s
        c = m.decode_context_tokens
        if c == c and c > 0:  # something decodes: follow the context's drift
            self.context_f = c if self.context_f is None or self.context_tau_s <= 0 else \
                self.context_f + (1.0 - math.exp(-self.sample_period / self.context_tau_s)) * (c - self.context_f)
        ctx = self.context_f if self.context_f is not None else self.nominal_context_tokens
        pass_now = self.pass_time_s(self.cap, ctx)
        workers = m.decode_workers if m.decode_workers == m.decode_workers and m.decode_workers > 0 else 1.0
        batch = m.active_decodes / workers
        tol = max(1.0, 0.02 * self.cap)
        if self.gated:
            if m.time_s < self.changed_at + self.settle_passes * pass_now:
                return BatchCapAction(self.cap)  # the last change is not visible in this sample yet
            if self.lowered and batch > self.cap + tol and m.time_s < self.changed_at + self.drain_timeout_s:
                return BatchCapAction(self.cap)  # the batch has not come down to the lowered cap yet
        if y == y and y > 0:  # something decodes: correct the model
            binds = batch >= self.cap - tol
            err = y - self.target_s
            # gated, a whole-sequence cap leaving the pass up to one sequence's step under the target
            # is the cap's resolution, not a model error (integrating it toggles the cap by one
            # sequence every few holds); the ungated rule, the naive engine's, integrates everything
            step = self.pass_time_s(self.cap + 1.0, ctx) - self.pass_time_s(self.cap, ctx)
            resolution = self.gated and -step < err <= 0.0
            if (err > 0 or binds) and not resolution:  # raising a cap the batch does not reach shows nothing
                self.bias = min(max(self.bias + self.gain * err, -self.target_s), 0.9 * self.target_s)
        new = largest_batch(self.pass_time_s, self.target_s - self.bias, ctx, self.max_batch, self.min_batch)
        new = float(math.floor(new)) if new >= self.min_batch + 1 else float(self.min_batch)
        if abs(new - self.cap) >= max(1.0, 0.02 * self.cap):  # smaller moves are noise in the context
            self.lowered = new < self.cap
            self.cap = new
            self.changed_at = t  # a measurement taken after t + one pass shows the change
            self.changes += 1
        return BatchCapAction(self.cap)

    def params(self) -> dict:
        return {"slo_tpot_s": self.slo_tpot_s, "tpot_fraction": self.tpot_fraction, "target_s": self.target_s,
                "short_output_tokens": self.short_output_tokens, "kv_transfer_s": self.kv_transfer_s,
                "max_batch": self.max_batch,
                "min_batch": self.min_batch, "gain": self.gain, "gated": self.gated,
                "settle_passes": self.settle_passes, "context_tau_s": self.context_tau_s,
                "drain_timeout_s": self.drain_timeout_s,
                "sample_period": self.sample_period}


def batch_gate_delay(measurement_delay_s: float, pass_s: float, snapshot_s: float, sample_period_s: float,
                     gated: bool) -> tuple[float, float]:
    """The batch-cap loop's delay and hold: (effective delay theta, hold period).

    A change reaches the measured pass time after one pass (sequences join or leave at pass
    boundaries) plus half a snapshot and the measurement delay. Gated, the controller acts once
    per hold = that delay rounded up to the next sample; ungated, every sample. A zero-order hold
    of period T adds T/2 (SIMC's half rule).

    Parameters
    ----------
    measurement_delay_s, pass_s, snapshot_s, sample_period_s : float
        The plant's measurement delay, the decode pass time, the snapshot period and the
        controller's sample period (s).
    gated : bool
        Whether the gate holds changes until observed.

    Returns
    -------
    tuple of float
        ``(theta_s, hold_s)``.
    """
    seen = measurement_delay_s + pass_s + 0.5 * snapshot_s
    hold = math.ceil(seen / sample_period_s - 1e-9) * sample_period_s + sample_period_s if gated else sample_period_s
    return seen + 0.5 * hold, hold


def batch_gate_loop(gain: float, hold_s: float, theta_s: float, *, slope_factor: float = 1.0,
                    name: str = "batch gate") -> DelayedLoop:
    """L(s) = (g / hold) x slope_factor x e^{-theta s} / s: the corrected target's integrator
    (``g`` per hold) around the plant pass time <- target (gain = true / modelled slope).

    Parameters
    ----------
    gain : float
        Correction per change (g).
    hold_s : float
        Seconds between changes (the sample period ungated, the observation time gated).
    theta_s : float
        Effective loop delay (:func:`batch_gate_delay`).
    slope_factor : float
        True over modelled pass-time slope (1 for an exact roofline).
    name : str
        The loop's name.

    Returns
    -------
    DelayedLoop
    """
    ki = gain / hold_s
    return loop_transfer(control.tf([ki], [1.0, 0.0]), control.tf([slope_factor], [1.0]), theta_s, name=name)


def predict_batch_cycle(loop: DelayedLoop, cap_range: float) -> LimitCycle | None:
    """Describing-function check of the cap's saturation (the cap lives in [min, max] batch):
    a limit cycle where 1 + N(A) L(jw) = 0 for python-control's saturation of half-width
    ``cap_range`` (in the loop's units), or None.

    A saturation's N(A) is real and in (0, 1], so the balance can only hold at a phase crossover
    of L where |L| >= 1: there N(A) = 1 / |L| is solved for A (bisection on the monotone N);
    :func:`tokenfactory.controllers.describing.predict_limit_cycles` would also search complex
    N, which a saturation does not need.

    Parameters
    ----------
    loop : DelayedLoop
        From :func:`batch_gate_loop`.
    cap_range : float
        Half the span the saturated signal can move (the loop's units, > 0).

    Returns
    -------
    LimitCycle or None
        The lowest-frequency predicted cycle.
    """
    N = control.saturation_nonlinearity(cap_range).describing_function
    w_pc, mag_pc = phase_crossovers(loop, 6)
    for wc, mag in sorted(zip(w_pc, mag_pc)):
        if mag <= 1.0 or not np.isfinite(mag):
            continue
        target = 1.0 / mag  # N(A) decreases from 1 (A <= width) to 0
        lo, hi = cap_range, cap_range
        while N(hi) > target:
            hi *= 2.0
        a = brentq(lambda x: N(x) - target, lo, hi)
        return LimitCycle(float(a), float(wc), "exact")
    return None


@dataclass
class BatchGateTuning:
    """How the gate's correction gain was chosen, and the loop's margins over the envelope.

    Attributes
    ----------
    gain : float
        The correction per change (g).
    hold_s, theta_s : float
        Hold period and effective delay of the gated loop (s).
    tau_c_s : float
        SIMC closed-loop time constant (s).
    nominal : Margins
        Margins at the nominal point.
    envelope : list of dict
        Rows ``delay_factor``, ``slope_factor``, verdict and margins.
    ungated : Margins
        Margins of the ungated rule (g = 1 every sample) at the nominal point.
    ungated_cycle : dict or None
        Its predicted limit cycle (describing function of the cap's saturation).
    """

    gain: float
    hold_s: float
    theta_s: float
    tau_c_s: float
    nominal: Margins
    envelope: list = field(default_factory=list)
    ungated: Margins | None = None
    ungated_cycle: dict | None = None

    @property
    def envelope_ok(self) -> bool:
        """Every envelope point stable and meeting the floors."""
        return all(r["meets_floors"] for r in self.envelope)

    def to_dict(self) -> dict:
        """Plain figures."""
        d = asdict(self)
        d["nominal"] = self.nominal.to_dict()
        d["ungated"] = self.ungated.to_dict() if self.ungated else None
        d["envelope_ok"] = self.envelope_ok
        return d


def tune_batch_gate(measurement_delay_s: float, pass_s: float, *, snapshot_s: float = 0.1,
                    sample_period_s: float = 0.1, delay_factors=(0.5, 1.0, 2.0),
                    slope_factors=(0.7, 1.0, 1.3), gm_floor: float = 2.0, pm_floor_deg: float = 45.0,
                    tau_c_factors=SIMC_TAU_C_FACTORS[:-1],
                    check_ungated: bool = False) -> BatchGateTuning:
    """SIMC for the gated loop: pure delay theta with gain 1 and an integrating controller,
    ki = 1 / (tau_c + theta) (Skogestad 2003, Table 1, tau1 -> 0), g = ki x hold; tau_c is the
    first of ``tau_c_factors`` x theta that keeps GM >= ``gm_floor`` and PM >= ``pm_floor_deg``
    at every (delay, slope) point of the envelope. Gated, the hold follows the delay (it waits for
    the measurement that shows the change), so a longer delay lowers ki with it.

    Parameters
    ----------
    measurement_delay_s, pass_s : float
        Nominal measurement delay and decode pass time (s).
    snapshot_s, sample_period_s : float
        Snapshot period and controller sample period (s; default 0.1 each).
    delay_factors, slope_factors : sequence of float
        The envelope: delay errors and true/modelled slope ratios.
    gm_floor, pm_floor_deg : float
        Margin floors.
    tau_c_factors : sequence of float
        Candidate tau_c / theta (default :data:`~tokenfactory.controllers.envelope_tuner.SIMC_TAU_C_FACTORS`
        up to 6; the search is :func:`~tokenfactory.controllers.envelope_tuner.simc_search`).
    check_ungated : bool
        Also analyse the ungated rule (margins and the describing-function cycle of the cap's
        saturation; a few seconds), for the before/after (default False).

    Returns
    -------
    BatchGateTuning
        With ``check_ungated``, also the ungated rule's nominal margins and predicted cycle.

    Raises
    ------
    ConfigError
        When no candidate meets the floors.
    """
    theta, hold = batch_gate_delay(measurement_delay_s, pass_s, snapshot_s, sample_period_s, True)
    points = []
    for d in delay_factors:
        th_d, hold_d = batch_gate_delay(measurement_delay_s * d, pass_s, snapshot_s, sample_period_s, True)
        points += [{"delay_factor": d, "slope_factor": s, "hold_s": hold_d, "theta_s": th_d} for s in slope_factors]

    def correction_at(f: float) -> float:
        # SIMC for a pure time delay k e^{-theta s} (Skogestad 2003, Table 1 with tau1 -> 0): I-control
        # with K_I = 1 / (k (tau_c + theta)), k = 1 through the model's inverse; g = K_I x hold
        return 1.0 / (f * theta + theta) * hold

    t = simc_search(theta, correction_at,
                    lambda g: [batch_gate_loop(g, p["hold_s"], p["theta_s"], slope_factor=p["slope_factor"])
                               for p in points],
                    points, nominal_loop=lambda g: batch_gate_loop(g, hold, theta), tau_c_factors=tau_c_factors,
                    gm_floor=gm_floor, pm_floor_deg=pm_floor_deg, field="batch_gate.envelope")
    tuning = BatchGateTuning(t.controller, hold, theta, t.tau_c_s, t.nominal, t.envelope)
    if check_ungated:
        th_u, hold_u = batch_gate_delay(measurement_delay_s, pass_s, snapshot_s, sample_period_s, False)
        ung_loop = batch_gate_loop(1.0, hold_u, th_u, name="ungated batch control")
        tuning.ungated = stability_margins(ung_loop)
        cyc = predict_batch_cycle(ung_loop, 1.0)
        tuning.ungated_cycle = cyc.to_dict() if cyc else None
    return tuning
