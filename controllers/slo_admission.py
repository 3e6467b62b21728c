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

* **No fail-open.** Before its first measurement the gate predicts from a prior sample: the
  plant empty at t = 0 with the pools it was built for (:attr:`SLOAdmissionConfig.fill_workers`,
  ``decode_slots``), everything admitted since in the ledger - so it decides every arrival from
  t = 0, and a flood before the first sample is refused with its reason like any other.
* **Outer loop on outcomes** (:class:`MarginLoopConfig`; issue 21). The model above stays the
  feed-forward; a slow loop on what admitted requests measurably get corrects its margin. Per
  class, each completed admitted request's slack s = min(1 - TTFT / SLO_ttft, 1 - TPOT /
  SLO_tpot) (negative: a miss; the plant reports completions through :meth:`observe`) is kept
  over the last ``window`` completions; every ``sample_period_s`` the share y of them with s <
  ``slack_target`` (the misses) is compared with ``miss_setpoint`` x the miss budget q
  (``quantile``, default 1 %: admitted attainment >= 0.99) and integrated into the class's margin
  r in [-1, 1]: r += ki T (setpoint q - y) / q - in units of the budget, so a class at 0.999
  relaxes at 0.7 budget units and one at 0.985 tightens at 0.7; one window's excess counts at
  most two budgets (:data:`MISS_ERROR_FLOOR`: a burst of misses does not close the gate for the run).
  The margin moves the gate between tighter than the model (r = -1: half the TTFT share, twice
  the completions kept in hand, more decode completions in hand) and the model's expectation
  (r = +1: the whole TTFT SLO, no completions kept in hand, the decode wait a mean-length
  request tolerates, no preemption quantile, the batch gate's target at the full KV batch). It
  relaxes only while the gate refused requests of the class - in the period, or since the oldest
  completion in the window was admitted, so the misses measured describe a binding gate - and
  the misses are below the setpoint (conditional integration: no windup while everything is
  admitted), and tightens whenever they are above it - the loop seeks goodput: it admits while the measured
  misses leave room in the budget. Past r = 1 (up to ``margin_max`` = 2) the margin corrects the
  model's queue prediction itself: the TTFT check counts (2 - r) of what other work is predicted
  to add to the request's fill alone - the queue wait and its steps' stretching on a busy pool
  (:meth:`SLOAwareAdmission.queue_weight`), so where the measured outcomes show the prediction
  conservative the gate goes on to admit, as far as open admission on the TTFT side; the hard
  limit stays - a request whose own fill alone misses its SLO is refused (``infeasible_slo``) - and
  the fast gate's fill-limit correction still tightens on the measured fill wait. (Before, the signal was the 1 % quantile of the slack held
  at 0: at an admitted attainment of 0.991-0.999 that quantile sits within a few hundredths of 0
  and the margin barely moved - azure-code-2023 at 0.9x its capacity, whole trace: 8.9 %
  rejected with 0.999 of the admitted interactive requests meeting the SLO.) Its linear model (:func:`margin_loop`) is an integrator on
  a static gain K (budget units of misses per unit of margin at the knee, :data:`MARGIN_GAIN`)
  behind the delay from admission to outcome; :func:`tune_margin_loop` SIMC-tunes ki over a
  delay x gain envelope and :func:`margin_separation` measures its separation from the fast gate
  (the fill-limit loop's closed-loop bandwidth over the outer crossover) with
  :func:`tokenfactory.controllers.separation.cascade_separation`. **Its start is gain-scheduled**
  on the measured misses (``MarginLoopConfig.ki_flat``): below the knee a unit of margin moves the
  misses by about :data:`FLAT_MARGIN_GAIN` budgets (mooncake-conversation), 25 x less than the
  gain ki is tuned for, so from r = 0 the loop took the whole trace to climb where open admission
  already met the SLO. Until the top class's first window over the setpoint, a window without a
  miss integrates at ki_flat: SIMC at the flat gain, capped at :data:`FLAT_OVERSHOOT` of margin
  per delay (the knee is passed by at most that before a miss can show), its margins and
  separation certified at that gain (:func:`tune_flat_margin_gain`); after it, the nominal loop.
* **Preemption the reservation causes.** A lower-priority request borrows slots the top level
  may take back (preemption). It plans on the slots left by the top level's occupancy quantile
  over its own decode time (``preempt_z`` standard deviations above the mean, relaxed by the
  outer margin), so batch admission counts on the room that will still be there while it
  decodes, not only on the mean.

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
from tokenfactory.controllers.batch_gate import JOIN_WAIT_PASSES, largest_batch, pass_target_s
from tokenfactory.controllers.envelope_tuner import SIMC_TAU_C_FACTORS, SIMC_TAU_C_FACTORS_WIDE, simc_search
from tokenfactory.controllers.interface import SampledController, lowpass
from tokenfactory.controllers.stability import DelayedLoop, Margins
from tokenfactory.core.signals import ADMIT, AdmissionAction, Arrival, Decision, Measurement, ReserveAction
from tokenfactory.core.validation import ConfigError, config_or_fields, check_fields, check_int, check_number, setting

__all__ = ["DEFAULT_TTFT_FRACTION", "SLOAdmissionConfig", "MarginLoopConfig", "SLOAwareAdmission", "GateLoopTuning",
           "MarginLoopTuning", "slo_gate_loop", "tune_slo_admission", "margin_loop", "tune_margin_loop",
           "margin_separation", "tune_flat_margin_gain", "reserve_share", "MARGIN_GAIN", "FLAT_MARGIN_GAIN",
           "FLAT_OVERSHOOT", "MISS_ERROR_FLOOR", "short_bound_ramp_rate"]


#: share of the TTFT slack (the SLO less the request's own fill alone) its predicted TTFT may
#: use: the own fill is the service model's per-request figure (exact for a request alone in the
#: request simulator), so the margin covers the queue's prediction only. Measured in the overload
#: study (mooncake-conversation, SLO attainment at 0.6x / 0.9x): 0.8 gave 0.474 / 0.488, 0.9
#: 0.535 / 0.579, admitted requests meeting their SLO 1.000 in both; the Azure traces unchanged
DEFAULT_TTFT_FRACTION = 0.9


#: the outer loop's error floor (budget units): one bursty window of misses (10 % of 200
#: completions is -9.2 budgets) tightens the margin like two budgets' worth, so a burst the margin
#: did not cause does not close the gate for the rest of the run (a saturation before the
#: integrator only slows the loop). Measured on azure-code-2023 at 2x (whole trace): unclipped,
#: 2,781 rejections and 262 tok/s; the old quantile rule 2,129 and 287 tok/s
MISS_ERROR_FLOOR = -2.0


@dataclass(frozen=True)
class MarginLoopConfig:
    """The outer loop on outcomes (module notes): per class, the share of the last ``window``
    admitted completions that missed (slack below ``slack_target``), held at ``miss_setpoint``
    x the budget ``quantile`` by an integral correction of the class's admission margin.

    Parameters
    ----------
    sample_period_s : float
        Seconds between corrections (> 0; default 5: slow next to the gate's 0.25 s).
    ki : float
        Integral gain (margin per second per budget unit of miss error, >= 0; default 0.004, about
        what :func:`tune_margin_loop` gives the default azure-conv setup - the registry tunes it
        per plant).
    quantile : float
        q, the miss budget: the share of admitted requests that may miss their SLO ((0, 0.5];
        default 0.01: admitted attainment >= 0.99).
    slack_target : float
        A completion counts as a miss when its slack is below this share of its SLO ([-1, 1];
        default 0: it missed).
    miss_setpoint : float
        The share of the budget the misses are held at ((0, 1]; default 0.8: admitted attainment
        0.992, a fifth of the budget kept for the window's noise and drift between corrections.
        Measured on azure-code-2023 (whole trace, 2x): 0.5 tightened the gate to 3,129 rejections
        and 242 tok/s where the old quantile rule held 2,119 and 287 tok/s).
    window : int
        Completions per class the miss share is taken over (>= 20; default 200: its lag, half its
        span, is most of the loop's delay, and 200 still resolves the 0.5 % setpoint as one miss).
    min_samples : int
        Completions a class needs before its margin moves (>= 1; default 50).
    initial_margin : float
        r at the start, in [-1, ``margin_max``] (default 0: the gate's own margins).
    margin_max : float
        Largest r, in [1, 2] (default 2). Above 1 the margin corrects the model itself: the TTFT
        check counts (2 - r) of what other work is predicted to add to a request's fill alone
        (the queue wait, its steps' stretching on a busy pool; r = 2: the TTFT side admits what
        its own fill allows, as open admission does; the own fill against the SLO - the hard
        limit - is always checked). 1: the model's expectation is the loosest the gate goes (the
        rule before; mooncake-conversation, whole trace: r sat at 1.0 from t = 7,400 s with 1,675
        interactive requests refused on their predicted TTFT, 972 of which met the SLO under open
        admission). Measured there at 1.3x with the loop held at fixed r: 1.0 - 185 tokens/s,
        admitted interactive 0.9954; 1.5 - 206 tokens/s (open admission's 206), 0.9949; 2.0 - 221,
        0.965: the misses' gain past 1.5 is about 6 budgets per unit of r, inside the certified
        envelope (2.5 x 0.25-4), and near 0 between 1 and 1.5.
    ki_flat : float, optional
        Integral gain of the start, where the loop's local gain is low (>= ``ki``; default None:
        ``ki``, no scheduling). The top class's margin integrates at it while its window holds no
        miss at all and no window of it has yet been over the setpoint: the margin is then in the
        flat region below the knee, where a unit of r moves the misses by about
        :data:`FLAT_MARGIN_GAIN` budgets, not :data:`MARGIN_GAIN`. A window with a miss, every
        window after the first one over the setpoint, and every lower class integrate at ``ki``.
        With ``fast_start`` the registry sets it with :func:`tune_flat_margin_gain`: SIMC at the
        flat gain, capped so the start overshoots the knee by at most :data:`FLAT_OVERSHOOT`
        before misses can show, its margins certified over the delay x gain envelope (module notes).
    fast_start : bool
        True: the registry tunes ``ki_flat`` (default False: the faster start wins goodput on
        whole traces but lets admitted attainment fall below 0.99 on some; docs/architecture.md).
    fresh_only : bool
        True: a class's margin tightens only when its window gained completions since the previous
        correction (default False; relaxing is never held: a class refused outright completes
        nothing). A starved class (nothing admitted completes) otherwise keeps
        integrating the same old misses every period and its margin runs to -1 on no new
        information - the integrator winds up on a frozen measurement. Measured on azure-conv-2023
        (whole trace, 0.9x): the batch window froze at a miss share of 0.3455 and its margin fell
        towards -1; with a guard holding both directions goodput 1,276 -> 1,322 tok/s, admitted
        batch attainment 0.66 -> 0.875 (off by default until the other whole-trace cells are
        measured). The loop's certificate is unchanged: a held sample is a zero-order hold longer
        than ``sample_period_s`` only while no outcome arrives, i.e. the integrator pauses; it
        never integrates faster or on a larger error.
    decode_past_model : bool
        True: past r = 1 the decode check is corrected like the TTFT check - it counts (2 - r) of
        the predicted ready wait (:meth:`SLOAwareAdmission.decode_weight`;
        r = 2: the decode side admits as open admission does), so where the admitted requests'
        measured misses stay below the setpoint the outer loop goes on to relax the decode side of
        the model too, and their misses bring it back. False (default): above r = 1 only the TTFT
        side moves; a class refused on its predicted ready wait at r = 1 stays refused at r = 2.
        The loop's structure is unchanged (the same integrator on the same margin range, so
        :func:`tune_margin_loop`'s ki and margins stand); what the flag can change is the plant
        gain past r = 1, certified for 0.6-10 budgets of misses per unit of r. Not measured apart:
        on the whole-trace cells (benchmarks/results/adm7.json, 0.9x and 1.3x of five traces) the
        flag changed one request of one cell - no class refused on its decode side had a margin
        past 1 (azure-conv-2023 at 0.9x: the interactive margin stayed in [-0.05, 0.11]).
    short_bound_target : bool
        True: the top class's margin moves the decode batch gate's pass target from the short-request
        bound alone at r = 0 (:func:`~tokenfactory.controllers.batch_gate.pass_target_s` with
        ``tpot_fraction`` 1: a short request's TPOT with a whole pass's wait to join the batch) down
        to the gate's ``tpot_fraction`` target at r = -1, linearly in the pass time
        (:meth:`SLOAwareAdmission.gate_targets`); r > 0 as before, from the r = 0 target toward the
        full KV batch. The r = 0 target starts at the ``tpot_fraction`` target and walks toward the
        short bound only as measured slack accumulates (``short_bound_rate``: the start does not
        overshoot the knee). False (default): r < 0 leaves the target at the gate's own,
        ``tpot_fraction`` x the SLO bounded by the short request's TPOT - two margins on one miss
        (azure-conv-2023, whole trace at 0.9x: the tpot_fraction share binds, 0.095 s against the
        short bound's 0.0974 s, a cap of about 144 sequences where a fixed cap of 180 meets the 0.99
        attainment). Where the short bound binds (it is below ``tpot_fraction`` x the SLO) the two
        targets are one and the flag changes nothing (azure-code-2023, agentic-coding,
        mooncake-conversation: every whole-trace cell measured unchanged). The loop's structure is
        unchanged (one integrator on the same margin); the misses' gain over r in [-1, 0] is the
        short requests' TPOT misses between the two targets - on azure-conv-2023 about 1.5 % of the
        admitted interactive requests at the short bound and 0.74 % at 0.095 s, 0.76 budgets per
        unit of r, at the low end of the certified 0.6-10. Measured with the instant start
        (``short_bound_rate = "instant"``, benchmarks/results/adm8_short_bound.json, whole trace):
        azure-conv-2023 1,313 -> 1,445 tok/s at 0.9x (admitted interactive 0.9926 -> 0.9908, batch
        0.816 -> 0.913), 1,323 -> 1,453 at 1.3x (0.9919 -> 0.98995, batch 0.926 -> 0.775: the
        loop starts at the loosest target and 61 of its 109 misses fell in the first 600 s);
        synthetic 1,229 -> 1,251 and 1,248 -> 1,282 (interactive >= 0.991).
    short_bound_rate : float or "instant", optional
        With ``short_bound_target``: how fast the start walks the r = 0 target from the
        ``tpot_fraction`` target to the short-request bound (share of the way per second at a
        window with no miss, > 0). The share s in [0, 1] starts at 0 (the target at r = 0 is
        then main's) and, at each correction of the top class whose misses are below the setpoint
        while the gate refuses (the conditions under which the margin itself relaxes), grows by
        rate x T x e / ``miss_setpoint`` (e the miss error in budgets: the full rate with no
        miss, none at the setpoint); it never falls - misses bring the target back down through
        r (r = -1: the ``tpot_fraction`` target whatever s). Default None:
        :func:`short_bound_ramp_rate`, :data:`FLAT_OVERSHOOT` of margin per delay (theta + half a
        sample; 0.00184/s on azure-conv-2023, a whole span in about 540 s of slack): the ramp
        passes the knee by at most that before a miss can show, the rate at which the certified
        scheduled start (:func:`tune_flat_margin_gain`, its margins and separation from the fast
        gate) relaxes the margin. ``"instant"``: s = 1 from t = 0 (the start measured in adm8,
        kept for comparison).
    enabled : bool
        False: the margin stays at ``initial_margin`` (default True).
    """

    sample_period_s: float = setting(5.0, unit="s", low=0.0, low_inclusive=False,
                                     meaning="seconds between corrections (slow next to the gate's)")
    ki: float = setting(0.004, low=0.0, meaning="integral gain, margin per second per budget unit of miss error "
                                                "(the registry tunes it per plant when absent)")
    quantile: float = setting(0.01, low=0.0, high=0.5, low_inclusive=False,
                              meaning="q, the miss budget: the share of admitted requests that may miss their SLO "
                                      "(0.01: admitted attainment >= 0.99)")
    slack_target: float = setting(0.0, low=-1.0, high=1.0,
                                  meaning="a completion counts as a miss when its slack is below this share of its "
                                          "SLO (0: it missed)")
    miss_setpoint: float = setting(0.8, low=0.0, high=1.0, low_inclusive=False,
                                   source="azure-code-2023, whole trace at 2x: 0.5 gave 3,129 rejections and "
                                          "242 tok/s where the old quantile rule held 2,119 and 287 tok/s",
                                   meaning="the share of the budget the misses are held at (0.8: admitted "
                                           "attainment 0.992, a fifth of the budget kept for noise)")
    window: int = setting(200, kind=int, low=20, unit="completions",
                          meaning="completions per class the miss share is taken over")
    min_samples: int = setting(50, kind=int, low=1, unit="completions",
                               meaning="completions a class needs before its margin moves")
    initial_margin: float = setting(0.0, low=-1.0, high=2.0, meaning="the admission margin at the start")
    margin_max: float = setting(2.0, low=1.0, high=2.0,
                                meaning="largest margin; above 1 the TTFT check counts (2 - r) of what other work "
                                        "is predicted to add to a request's fill alone (its own fill is always "
                                        "checked)")
    ki_flat: float | None = setting(None, low=0.0,
                                    meaning="integral gain while the window holds no miss (the flat region below "
                                            "the knee; the registry tunes it at FLAT_MARGIN_GAIN; absent: ki)")
    fast_start: bool = setting(False, kind=bool,
                               meaning="true: the registry tunes ki_flat (the scheduled start below the knee); off by "
                                       "default: it wins goodput on whole traces but lets admitted attainment fall "
                                       "below 0.99 on some (docs/architecture.md)")
    fresh_only: bool = setting(False, kind=bool,
                               source="azure-conv-2023, whole trace at 0.9x: goodput 1,276 -> 1,322 tok/s, "
                                      "admitted batch attainment 0.66 -> 0.875",
                               meaning="true: a class's margin tightens only when its window gained completions "
                                       "since the previous correction (no windup on a starved class's stale misses)")
    decode_past_model: bool = setting(False, kind=bool,
                                      meaning="true: past r = 1 the decode check counts (2 - r) of the predicted "
                                              "ready wait (r = 2: the decode side admits as open admission does)")
    short_bound_target: bool = setting(False, kind=bool,
                                       meaning="true: at r = 0 the batch gate aims at the short-request "
                                               "bound alone (tpot_fraction 1) and r in [-1, 0) moves its target "
                                               "down to the tpot_fraction target",
                                       source="azure-conv-2023, whole trace: 1,313 -> 1,445 tok/s at 0.9x, "
                                              "1,323 -> 1,453 at 1.3x with admitted interactive 0.98995 (off: "
                                              "below 0.99)")
    short_bound_rate: float | str | None = setting(None, low=0.0, low_inclusive=False, unit="1/s", also=("instant",),
                                                   meaning="with short_bound_target: the share of the way from the "
                                                           "tpot_fraction target to the short bound the start walks "
                                                           "per second of measured slack (absent: "
                                                           "short_bound_ramp_rate, FLAT_OVERSHOOT of margin per "
                                                           "delay; instant: at the short bound from t = 0)")
    enabled: bool = setting(True, kind=bool, meaning="false: the margin stays at initial_margin")

    def __post_init__(self) -> None:
        # checked against the declarations (values kept as given); bounds set by another field per instance
        w = "slo_aware.outer"
        check_fields(self, w, names=("sample_period_s", "ki", "quantile", "slack_target", "miss_setpoint", "window",
                                     "min_samples", "margin_max", "short_bound_rate"), hold=False)
        check_fields(self, w, names=("initial_margin", "ki_flat"), hold=False,
                     bounds={"initial_margin": {"high": self.margin_max}, "ki_flat": {"low": self.ki}})

    @property
    def ki_scheduled(self) -> float:
        """The gain used while the window holds no miss (``ki_flat``, else ``ki``)."""
        return self.ki if self.ki_flat is None else self.ki_flat


@dataclass(frozen=True)
class SLOAdmissionConfig:
    """Everything :class:`SLOAwareAdmission` is built from (validated by the controller; the
    registry's :func:`tokenfactory.registry.slo_aware_admission` resolves it from a plant).

    Parameters
    ----------
    fill_token_rate : float
        New prompt tokens/s one fill worker fills (roofline, full steps; > 0); the measured
        ``fill_token_capacity`` replaces it when the plant reports one.
    fill_step_s : float
        One full fill step (s, >= 0): the wait for the step in progress.
    kv_transfer_s : float
        KV transfer of the nominal request (s, >= 0).
    decode_pass_s : float
        Decode pass time the batch cap aims at (s, > 0): the per-token time of a decoding sequence
        (:func:`tokenfactory.controllers.batch_gate.pass_target_s`).
    prompt_tokens : float
        Nominal new prompt tokens of a request (> 0; converts the rate for fluid plants).
    output_tokens : mapping or float
        Expected output tokens per class name (or one number for every class; > 1).
    classes : tuple of RequestClass, optional
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
        150 = start-up 120 s + warm-up 30 s of :class:`tokenfactory.plant_models.fleet.PoolDynamics`).
    reserve_z : float
        Quantile of the fill reservation (>= 0; default 2.33, 99 %; at most half of each step).
    decode_reserve_z : float
        Standard deviations above its mean of the top level's decode occupancy held for it
        (>= 0; default 0, the mean).
    preempt_z : float
        Standard deviations above its mean of the top level's occupancy over a lower-priority
        request's decode time that the request plans around (>= 0; default 1: the slots it
        borrows stay free for it with about 84 % probability, so it is rarely preempted).
    completion_z : float
        Standard deviations of the Poisson completions over the prediction horizon kept in hand
        in the decode prediction (>= 0; default 2).
    decode_reserve_s : float
        How far below zero the decode-wait limit may be corrected (s of completions in hand,
        >= 0; default 2).
    gate_time_s : float, optional
        h: the time the rate form (fluid plants) takes to fill the room (s; default the sample period).
    sample_period : float
        Seconds between updates (> 0; default 0.25).
    fill_chunk_tokens : float
        New tokens of one request a fill step takes at most (default inf).
    fill_workers : float
        Fill workers the plant starts with (>= 1; default 1): the prior sample's fill capacity.
    decode_slots : float
        Decode slots the plant starts with (>= 0; default 0: the gate then admits nothing into
        decode until measured - closed, not open).
    outer : MarginLoopConfig
        The outer loop on outcomes.
    """

    fill_token_rate: float
    fill_step_s: float
    kv_transfer_s: float
    decode_pass_s: float
    prompt_tokens: float
    output_tokens: Mapping[str, float] | float
    classes: tuple | None = None
    short_output_tokens: Mapping[str, float] | float | None = None
    ttft_fraction: float = DEFAULT_TTFT_FRACTION
    wait_target_fraction: float = 0.5
    fill_ki: float = 0.5
    decode_ki: float = 0.2
    filter_tau_s: float = 0.5
    cached_token_cost: float = 0.0
    reserve_horizon_s: float = 150.0
    reserve_z: float = 2.33
    decode_reserve_z: float = 0.0
    preempt_z: float = 1.0
    completion_z: float = 2.0
    decode_reserve_s: float = 2.0
    gate_time_s: float | None = None
    sample_period: float = 0.25
    fill_chunk_tokens: float = math.inf
    fill_workers: float = 1.0
    decode_slots: float = 0.0
    outer: MarginLoopConfig = field(default_factory=MarginLoopConfig)

    def to_dict(self) -> dict:
        """Plain fields."""
        d = {f: getattr(self, f) for f in self.__dataclass_fields__}
        d["classes"] = [asdict(c) for c in self.classes] if self.classes else None
        d["outer"] = asdict(self.outer)
        return d


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
    config : SLOAdmissionConfig, optional
        The gate's parameters (every field validated here, named ``slo_aware.FIELD``).
    batch_gate : BatchGate, optional
        A decode batch gate run at this controller's samples (its cap is returned with the
        admission actions); None (default): no batch control.
    fill_time_s : callable, optional
        The request's own fill from the service model,
        ``fill_time_s(new_tokens, cached_tokens, step_floor_s=0.0, step_tokens=None) -> s``
        (:meth:`tokenfactory.plant_models.service.ServiceModel.request_fill_s`). With it the own
        fill is the request's chunked fill alone on an idle fill pool, and in steps of the full
        budget lasting at least the busy step on a busy one; a request whose fill alone already
        misses its class's TTFT SLO is rejected at arrival (``infeasible_slo``). None (default):
        one full step per chunk.
    **fields
        :class:`SLOAdmissionConfig` fields, when no ``config`` is given.
    """

    name = "slo-aware"

    def __init__(self, config: SLOAdmissionConfig | None = None, *, batch_gate=None,
                 fill_time_s: Callable[..., float] | None = None, **fields):
        config = config_or_fields("slo_aware", SLOAdmissionConfig, config, fields)
        if not isinstance(config.outer, MarginLoopConfig):
            raise ConfigError("slo_aware.outer", "must be a MarginLoopConfig")
        self.config = c = config
        (fill_token_rate, fill_step_s, kv_transfer_s, decode_pass_s, prompt_tokens, output_tokens, classes,
         short_output_tokens, ttft_fraction, wait_target_fraction, fill_ki, decode_ki, filter_tau_s,
         cached_token_cost, reserve_horizon_s, reserve_z, decode_reserve_z, completion_z, decode_reserve_s,
         gate_time_s, sample_period, fill_chunk_tokens) = (
            c.fill_token_rate, c.fill_step_s, c.kv_transfer_s, c.decode_pass_s, c.prompt_tokens, c.output_tokens,
            c.classes, c.short_output_tokens, c.ttft_fraction, c.wait_target_fraction, c.fill_ki, c.decode_ki,
            c.filter_tau_s, c.cached_token_cost, c.reserve_horizon_s, c.reserve_z, c.decode_reserve_z,
            c.completion_z, c.decode_reserve_s, c.gate_time_s, c.sample_period, c.fill_chunk_tokens)
        check_number("slo_aware.sample_period", sample_period, low=0.0, low_inclusive=False)
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
        self.preempt_z = check_number(f"{w}.preempt_z", c.preempt_z, low=0.0)
        self.prior_fill_workers = check_number(f"{w}.fill_workers", c.fill_workers, low=1.0)
        self.prior_decode_slots = check_number(f"{w}.decode_slots", c.decode_slots, low=0.0)
        self.outer = c.outer
        # the start's ramp toward the short-request bound (short_bound_target): share per second
        o = c.outer
        self.short_bound_rate = (math.inf if o.short_bound_rate == "instant" else
                                 short_bound_ramp_rate(self.outcome_delay_s, sample_period_s=o.sample_period_s)
                                 if o.short_bound_rate is None else float(o.short_bound_rate))
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
        # the decode wait a mean-length request tolerates: the outer margin's loosest decode limit
        self.decode_limit_mean = {n: max((self.classes[n].slo_tpot_s - p) * (self.out[n] - 1.0)
                                         - self.kv_transfer_s - JOIN_WAIT_PASSES * p, 0.0) for n in names}
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
        """Forget the plant: the prior sample (empty plant at t = 0), empty ledger, no bias,
        nothing reserved, the outer margins at their initial value."""
        self.m: Measurement = self.prior()
        self.measured = False
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
        self.margin = {n: float(self.outer.initial_margin) for n in self.classes}
        self.slack = {n: deque(maxlen=self.outer.window) for n in self.classes}
        self.refused_class = {n: 0 for n in self.classes}
        self.last_refused_s = {n: -math.inf for n in self.classes}
        self.slack_t = {n: deque(maxlen=self.outer.window) for n in self.classes}
        self.observed = {n: 0 for n in self.classes}       # completions observed per class
        self.observed_at_tick = {n: 0 for n in self.classes}  # ... at the previous correction
        self.outer_last_s = 0.0
        self.flat_done = {n: False for n in self.classes}
        self.outer_log: list = []
        # the start's share of the way from the tpot_fraction target to the short bound (short_bound_target)
        self.short_bound_share = 1.0 if math.isinf(self.short_bound_rate) else 0.0
        self._gate_target = None
        if self.batch_gate is not None:
            self.batch_gate.reset()

    def prior(self) -> Measurement:
        """The sample the gate predicts from before the plant's first: empty at t = 0, the pools it
        was built for (no fail-open: the ledger counts everything admitted since)."""
        mu = self.fill_token_rate * self.prior_fill_workers
        return Measurement(time_s=0.0, backlog=0.0, fill_in_progress=0.0, ready=0.0, active_decodes=0.0,
                           completion_rate=0.0, admitted_rate=0.0, decode_slots=self.prior_decode_slots,
                           fill_capacity=mu / self.prompt_tokens, fill_workers=self.prior_fill_workers,
                           fill_queued_tokens=0.0, fill_token_capacity=mu)

    # -- the outer loop ---------------------------------------------------------------------
    @property
    def outcome_delay_s(self) -> float:
        """Admission to outcome of the top class's mean request: its TTFT SLO plus its decode
        time at the target pass (s) - the outer loop's delay."""
        return self.classes[self.top].slo_ttft_s + self.out[self.top] * self.decode_pass_s

    def observe(self, t: float, outcomes) -> None:
        """Outcomes of admitted requests as they complete (the orchestrator streams their tokens):
        ``(class, ttft_s, tpot_s)`` each. Their slack feeds the outer loop (module notes).

        Parameters
        ----------
        t : float
            Now (s).
        outcomes : iterable of tuple
            ``(class name, TTFT s, TPOT s)``.
        """
        for name, ttft, tpot in outcomes:
            c = self.classes.get(name)
            if c is None:
                continue
            self.slack[name].append(min(1.0 - ttft / c.slo_ttft_s, 1.0 - tpot / c.slo_tpot_s))
            self.slack_t[name].append(t)
            self.observed[name] += 1

    def _outer_update(self, t: float) -> None:
        o = self.outer
        if not o.enabled or t - self.outer_last_s < o.sample_period_s - 1e-9:
            return
        T = t - self.outer_last_s
        self.outer_last_s = t
        row = {"time_s": t}
        for n in self.classes:
            buf = self.slack[n]
            fresh = self.observed[n] > self.observed_at_tick[n]
            self.observed_at_tick[n] = self.observed[n]
            if len(buf) >= o.min_samples:
                misses = sum(1 for x in buf if x < o.slack_target)
                y = misses / len(buf)  # the misses' share
                # in units of the budget, a window's excess clipped at MISS_ERROR_FLOOR budgets
                e = max((o.miss_setpoint * o.quantile - y) / o.quantile, MISS_ERROR_FLOOR)
                # relax only while it refuses (no windup): refused in this period, or since the
                # window's oldest measured completion was admitted - the misses measured describe
                # a gate that was binding (bursty traces refuse in short stretches)
                binding = self.refused_class[n] > 0 or \
                    self.last_refused_s[n] >= self.slack_t[n][0] - self.outcome_delay_s
                if e < 0:
                    self.flat_done[n] = True  # the start is over: the knee was found
                # e < 0: misses over the setpoint, a tightening step
                stale = o.fresh_only and not fresh and e < 0
                if (e < 0 or binding) and not stale:
                    # (fresh_only: a window without new completions carries no new misses;
                    # tightening on it again winds the margin up on a starved class's old misses.
                    # Relaxing stays allowed: a class refused outright completes nothing and could
                    # otherwise never relax out of its own refusal)
                    # gain scheduled on the measured misses (the top class only: a lower class's
                    # relaxation spends the top class's latency before its misses show): until
                    # its first window over the setpoint, a window with no miss in it is in the
                    # flat region, whose low local gain the scheduled ki compensates
                    flat = n == self.top and not self.flat_done[n] and misses == 0
                    ki = o.ki_scheduled if flat else o.ki
                    self.margin[n] = min(max(self.margin[n] + ki * T * e, -1.0), o.margin_max)
                if n == self.top and o.short_bound_target and e > 0 and binding and self.short_bound_share < 1.0:
                    # the start's ramp toward the short bound: only on measured slack (misses below
                    # the setpoint while the gate refuses), in proportion to it, never back
                    self.short_bound_share = min(self.short_bound_share
                                                 + self.short_bound_rate * T * e / o.miss_setpoint, 1.0)
                    self._gate_target = None
                row[f"{n}:miss_share"] = y
            row[f"{n}:margin"] = self.margin[n]
            self.refused_class[n] = 0
        if o.short_bound_target:
            row["short_bound_share"] = self.short_bound_share
        self.outer_log.append(row)

    def _knobs(self, name: str) -> tuple[float, float, float]:
        """(TTFT share, completion z, preemption z) of class ``name`` at its margin."""
        r = min(self.margin.get(name, 0.0), 1.0)  # above 1 the queue's prediction moves (queue_weight)
        f = self.ttft_fraction
        if r >= 0:
            return f + r * (1.0 - f), self.completion_z * (1.0 - r), self.preempt_z * (1.0 - r)
        return f * (1.0 + 0.5 * r), self.completion_z * (1.0 - r), self.preempt_z * (1.0 - r)

    def _decode_margin(self, name: str, limit: float) -> float:
        """The decode-wait limit of class ``name`` moved by its margin: toward what a mean-length
        request tolerates (r > 0) or further into completions in hand (r < 0)."""
        r = min(self.margin.get(name, 0.0), 1.0)
        if r >= 0:
            return limit + r * max(self.decode_limit_mean[name] - limit, 0.0)
        return limit + r * self.decode_reserve_s

    def queue_weight(self, name: str) -> float:
        """The share of what other work adds to a request's fill alone (the predicted queue wait
        and its steps' stretching on a busy pool) that class ``name``'s TTFT check counts: 1 up to
        r = 1, then 2 - r (r = 2: none - the TTFT side admits on the request's own fill alone).
        The outer loop goes there only while the admitted requests' measured misses stay below
        the setpoint: the model's queue prediction is corrected by outcomes, not trusted past them.
        """
        return min(max(2.0 - self.margin.get(name, 0.0), 0.0), 1.0)

    def decode_weight(self, name: str) -> float:
        """The share of the predicted ready wait (when positive) that class ``name``'s decode check
        counts: 1 unless ``MarginLoopConfig.decode_past_model``, then 1 up to r = 1
        and 2 - r above (r = 2: none - the decode side admits as open admission does). As
        :meth:`queue_weight` for the TTFT side: the outer loop goes there only while the admitted
        requests' measured misses stay below the setpoint, and their misses bring it back.

        Parameters
        ----------
        name : str
            The class.

        Returns
        -------
        float
            In [0, 1].
        """
        if not self.outer.decode_past_model:
            return 1.0
        return self.queue_weight(name)

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

    def _slots(self) -> float:
        """Decode slots as measured, at most the workers x the cap this gate's own batch gate has
        commanded (a cap it set is in force before a measurement shows it)."""
        m = self.m
        slots = m.decode_slots
        if self.batch_gate is not None and math.isfinite(self.batch_gate.cap):
            workers = m.decode_workers if m.decode_workers == m.decode_workers else None
            if workers is None and math.isfinite(m.decode_batch_cap) and m.decode_batch_cap > 0:
                workers = slots / m.decode_batch_cap
            if workers is not None:
                slots = min(slots, workers * self.batch_gate.cap)
        return slots

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
            Time to first token from now (its fill-queue part weighted by :meth:`queue_weight`,
            1 unless the outer margin is above 1), and the wait for a decode slot after its KV lands
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
        # the TTFT check counts queue_weight of what other work adds to the request's fill alone -
        # the queue ahead and the stretching of its steps on a busy pool (1 unless the outer margin
        # is above 1); the decode side plans on the whole prediction
        name = a.request_class if a.request_class in self.classes else self.top
        w = self.queue_weight(name)
        self.last_fill_wait = w * work / rate
        horizon = work / rate + own + self.kv_transfer_s
        if w < 1.0 and self.fill_time_s is not None:  # (without it the own fill is already its chunks alone)
            alone = self.fill_time_s(a.prompt_tokens, a.cached_tokens)
            own = alone + w * max(own - alone, 0.0)
        ttft = self.last_fill_wait + own
        # decode: the top level may take every slot (lower levels are preempted for it); a lower
        # level gets the slots the top level neither holds nor has reserved
        slots = self._slots()
        seq_top = pass_s * self.out[self.top]
        free_top = min(active[0], slots) / seq_top if seq_top > 0 else math.inf
        occ_top = max(occ[0] - free_top * age, 0.0)
        _, completion_z, preempt_z = self._knobs(name)
        if lvl == 0:
            occ_j, free_j, avail, seq_s = occ_top, free_top, slots, seq_top
        else:
            seq_s = pass_s * self.out.get(a.request_class, self.out[self.top])
            # the top level's occupancy over this request's decode time at the preempt_z quantile:
            # the slots it borrows that the top level will take back are not counted on
            n_top = max(self.top_rate_f or 0.0, 0.0) * seq_top
            held = self.decode_reserve + preempt_z * math.sqrt(n_top) if n_top > 0 else self.decode_reserve
            avail = slots - max(occ_top, held)
            free_j = min(active[1], max(avail, 0.0)) / seq_s if seq_s > 0 else math.inf
            occ_j = max(occ[1] - free_j * age, 0.0)
        ahead = occ_j + 1.0 - avail - free_j * horizon
        # completions are a Poisson stream: keep z standard deviations of them over the horizon in hand
        ahead += completion_z * math.sqrt(free_j * (age + horizon)) if free_j < math.inf else 0.0
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
        share = self._knobs(name)[0]
        ttft_ok = elapsed + ttft <= c.slo_ttft_s - (1.0 - share) * (c.slo_ttft_s - solo)
        decode_limit = self.decode_limit_max[name]
        if name == self.top:
            ttft_ok = ttft_ok and self.last_fill_wait <= self.fill_limit()
            decode_limit = self.decode_limit()
        decode_limit = self._decode_margin(name, decode_limit)
        # past r = 1 (decode_past_model) the check counts decode_weight of the predicted wait (a
        # negative wait - completions in hand - is counted whole)
        w = self.decode_weight(name)
        if ttft_ok and (w * wait if wait > 0 else wait) <= decode_limit:
            self._admitted(t, a)
            return ADMIT
        reason = "predicted_slo_violation" if not ttft_ok else "decode_overloaded"
        self.refused["fill" if not ttft_ok else "decode"] += name == self.top
        self.refused_class[name] += 1
        self.last_refused_s[name] = t
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
        self.measured = True
        self._outer_update(t)
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
        slots = self._slots()
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
            g = self.batch_gate
            if self._gate_target is None:
                self._gate_target = self.gate_targets()
            # the top class's margin moves the cap's target between the short-request bound (r <= 0)
            # and a full KV batch (r = 1: memory only, as open admission), geometrically in the batch;
            # with short_bound_target, r in [-1, 0) moves it down from the r = 0 target (the start's
            # share of the way to the short-request bound alone) to the tpot_fraction target (r = -1),
            # linearly in the pass time
            t0, lo, hi, t_tight = self._gate_target
            r = min(max(self.margin[self.top], -1.0), 1.0)
            if r < 0:
                g.target_s = t0 + r * (t0 - t_tight)
            else:
                g.target_s = t0 if r == 0 else max(g.pass_time_s(lo * (hi / lo) ** r, g.nominal_context_tokens), t0)
            out.append(g.update(t, m))
        return out

    def gate_targets(self) -> tuple[float, float, float, float]:
        """The batch gate's pass targets the top class's margin moves between: ``(t0, lo, hi,
        t_tight)`` - the target at r = 0 (s), the cap it gives at the nominal context and the
        largest cap (sequences; r = 1 aims at the pass of the full batch ``hi``), and the target
        at r = -1 (s).

        Without :attr:`MarginLoopConfig.short_bound_target` t0 = t_tight = the gate's own target,
        ``tpot_fraction`` x the TPOT SLO bounded by the short request's TPOT
        (:func:`~tokenfactory.controllers.batch_gate.pass_target_s`), and r < 0 leaves it there.
        With it, t_tight is the gate's own target and t0 walks from it toward the short-request
        bound alone (tpot_fraction = 1: the join wait of a whole pass is already budgeted in it):
        t0 = t_tight + s (bound - t_tight), s the start's share (:attr:`short_bound_share`, 0 at
        the start, grown on measured slack at ``MarginLoopConfig.short_bound_rate``): where the
        misses of the top class's short requests (their TPOT carries one pass's wait to join the
        batch) are below the outer loop's setpoint the cap is not held below them by a second
        share, and where they are above it the margin brings the cap back to that share.

        Returns
        -------
        tuple of float
            ``(t0, lo, hi, t_tight)`` (the controller must have a batch gate).
        """
        g = self.batch_gate
        # the gate's own target from its configuration (g.target_s is the one this controller last set)
        t_tight = pass_target_s(g.slo_tpot_s, g.tpot_fraction, g.short_output_tokens, g.kv_transfer_s)
        t0 = t_tight
        if self.outer.short_bound_target and g.short_output_tokens is not None:
            bound = max(pass_target_s(g.slo_tpot_s, 1.0, g.short_output_tokens, g.kv_transfer_s), t_tight)
            t0 = t_tight + self.short_bound_share * (bound - t_tight)
        lo = largest_batch(g.pass_time_s, t0, g.nominal_context_tokens, g.max_batch, g.min_batch)
        return t0, lo, max(g.max_batch, lo), t_tight

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
        full = self._slots() / seq_s if seq_s > 0 else math.inf
        room_fill = (self.fill_limit() - self.last_fill_wait) * mu
        room_decode = (self.decode_limit() - wait) * full
        rate = max(min(mu + room_fill / h, full + room_decode / h), 0.0)
        return AdmissionAction(rate, rate * self.sample_period, "predicted_slo_violation")

    def params(self) -> dict:
        return {"config": self.config.to_dict(), "fill_token_rate": self.fill_token_rate, "fill_step_s": self.fill_step_s,
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
                "batch_gate": self.batch_gate.params() if self.batch_gate is not None else None,
                "outer_margin": self.outer_summary()}

    def outer_summary(self) -> dict:
        """Per class, the outer loop's margin at the end, its range over the run and the last
        measured miss share (what the run's results record of the outer loop)."""
        out = {}
        for n in self.classes:
            rs = [row[f"{n}:margin"] for row in self.outer_log]
            ys = [row[f"{n}:miss_share"] for row in self.outer_log if f"{n}:miss_share" in row]
            out[n] = {"final": self.margin[n], "min": min(rs, default=self.margin[n]),
                      "max": max(rs, default=self.margin[n]), "last_miss_share": ys[-1] if ys else None}
        return out


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
                       tau_c_factors=SIMC_TAU_C_FACTORS) -> dict[str, GateLoopTuning]:
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
    points = [{"delay_factor": d, "gain_factor": k} for d in delay_factors for k in gain_factors]
    out = {}
    for loop, theta in (("fill", theta_fill_s), ("decode", theta_decode_s)):
        check_number(f"tuning.theta_{loop}_s", theta, low=0.0, low_inclusive=False)
        t = simc_search(theta, lambda f, theta=theta: 1.0 / (f * theta + theta),
                        lambda ki, theta=theta: [slo_gate_loop(ki, theta * p["delay_factor"], gate_time_s,
                                                               gain_factor=p["gain_factor"]) for p in points],
                        points, nominal_loop=lambda ki, theta=theta, loop=loop: slo_gate_loop(
                            ki, theta, gate_time_s, name=f"{loop} gate"),
                        nonlinearity=control.saturation_nonlinearity(limit_range), tau_c_factors=tau_c_factors,
                        gm_floor=gm_floor, pm_floor_deg=pm_floor_deg, field=f"tuning.{loop}")
        out[loop] = GateLoopTuning(loop, theta, gate_time_s, t.tau_c_s, t.controller, t.nominal, t.envelope,
                                   t.limit_cycle)
    return out


# ------------------------------------------------------------------------------------------
# the outer loop's linear model, tuning and separation

#: the outer loop's plant gain K: budget units of admitted misses per unit of margin at the knee.
#: Measured on azure-conv-2023 at 0.9x (the first 4,000 requests, interactive class): pass
#: targets of 0.096 / 0.097 / 0.098 s (the margin's batch-gate target moves over that range by
#: r ~ 0.05-0.15) gave admitted misses of 0.8 / 1.6 / 2.2 % - about 10 budget units per unit of
#: r where the TPOT of short requests binds; the TTFT share moves the misses far less (mooncake-
#: conversation). 2.5 with the envelope's gain factors 0.25-4 covers 0.6-10.
MARGIN_GAIN = 2.5

#: the outer loop's plant gain in the flat region below the knee (budget units of misses per unit
#: of margin): measured on mooncake-conversation at 1.3x (whole trace, the loop held at fixed r):
#: admitted interactive attainment 0.9954 at r = 1.0 and 0.9949 at r = 1.5 (r = 0: the window's
#: misses mostly 0-0.5 %), i.e. about 0.1 budgets per unit of r where a whole window holds no miss;
#: past r = 1.5 about 6. The scheduled gain is SIMC-tuned at this gain (MarginLoopConfig.ki_flat)
FLAT_MARGIN_GAIN = 0.1

#: the most the scheduled gain moves the margin over the delay from a margin change to its first
#: outcome (theta + half an outer sample): the start passes the knee by at most this before the
#: first misses can show (at the envelope's steepest gain, 10 budgets per unit of r, half a
#: budget of extra misses until the nominal loop tightens). Measured on the whole-trace grid
#: (python -m benchmarks.run whole-trace, 20 cells): uncapped, the synthetic default at 1.1x
#: reached r = 0.58 before its first miss showed (admitted interactive 0.989); at 0.1,
#: azure-code-2023 at 1.3x climbed 0.32 in 20 s (its long outputs report late) and its admitted
#: interactive attainment fell to 0.983; at 0.05 every cell's admitted interactive attainment
#: was >= 0.990 but azure-code-2023 at 0.9x (0.988)
FLAT_OVERSHOOT = 0.05


def short_bound_ramp_rate(outcome_delay_s: float, *, sample_period_s: float = 5.0,
                          overshoot: float = FLAT_OVERSHOOT) -> float:
    """The start's ramp toward the short-request bound (``MarginLoopConfig.short_bound_rate``):
    the share of the way from the ``tpot_fraction`` target to the short bound per second at a
    window with no miss, ``overshoot`` of margin over the delay before a miss can show:
    rate = overshoot / (theta + T / 2), theta = the outcome delay + T / 2 (the delay
    :func:`tokenfactory.registry.margin_tuning` uses).

    A unit of the ramp moves the batch gate's target by at most what a unit of margin moves it
    ((1 + r) of the span at r <= 0), so the ramp relaxes the target at the rate the certified
    scheduled start relaxes the margin at its cap (:func:`tune_flat_margin_gain`: ki_flat <=
    overshoot / (miss_setpoint (theta + T / 2)), with no miss in the window the error is
    miss_setpoint budgets): as an integrator on the miss error its gain is rate / miss_setpoint, that
    cap. The margin's own relaxation (the nominal loop, ``ki``) comes on top while both move. The
    ramp never falls and stops at 1, so it is a bounded transient (it moves the target by one
    span in all) and no part of a sustained cycle: after it the loop is the nominal one
    (:func:`tune_margin_loop`, its separation from the fast gate :func:`margin_separation`).
    Measured on the whole-trace cells (benchmarks/results/adm9_rate_*.json, azure-conv-2023 and
    synthetic at 0.9-2x): this rate (0.00184/s there) kept admitted interactive attainment >= 0.99
    in all eight; 0.005/s and 0.02/s let azure-conv-2023 fall to 0.9894 / 0.9873 at 0.9x; the
    cap less the margin's relaxation (0.00073/s) held the cap near main's and lost goodput to it
    (azure-conv-2023 1.3x: 1,285 against 1,323 tok/s).

    Parameters
    ----------
    outcome_delay_s : float
        Admission to outcome of the top class's mean request (s, >= 0;
        :attr:`SLOAwareAdmission.outcome_delay_s`).
    sample_period_s : float
        T, the outer loop's sample period (s, > 0).
    overshoot : float
        Margin per delay (default :data:`FLAT_OVERSHOOT`).

    Returns
    -------
    float
        Share of the way per second (> 0).
    """
    check_number("outer.outcome_delay_s", outcome_delay_s, low=0.0)
    check_number("outer.sample_period_s", sample_period_s, low=0.0, low_inclusive=False)
    check_number("outer.overshoot", overshoot, low=0.0, low_inclusive=False)
    return overshoot / (outcome_delay_s + sample_period_s)


def margin_loop(ki: float, theta_s: float, window_s: float, *, gain: float = MARGIN_GAIN,
                name: str = "outer margin") -> DelayedLoop:
    """L(s) = ki K e^{-theta s} / (s (tau_w s + 1)): the integral correction of the margin, the
    miss share (in budget units) responding with gain K after theta (admission to outcome plus half an outer
    sample) and lagging by tau_w, half the span of the completions the quantile is taken over.

    Parameters
    ----------
    ki : float
        Integral gain (1/s).
    theta_s : float
        Delay from a margin change to its first outcomes (s).
    window_s : float
        Span of the quantile's window (s); tau_w = window_s / 2.
    gain : float
        K (default :data:`MARGIN_GAIN`).
    name : str
        The loop's name.

    Returns
    -------
    DelayedLoop
    """
    return DelayedLoop(control.tf([ki * gain], [0.5 * window_s, 1.0, 0.0]), theta_s, name)


@dataclass
class MarginLoopTuning:
    """The outer loop's tuning: delay, window, gain, ki, margins over the envelope.

    Attributes
    ----------
    theta_s, window_s, gain, tau_c_s, ki : float
        Delay, window span, plant gain, SIMC closed-loop time constant, integral gain.
    nominal : Margins
        Margins at the nominal point.
    envelope : list of dict
        Rows ``delay_factor``, ``gain_factor``, the verdict, margins, ``meets_floors``.
    """

    theta_s: float
    window_s: float
    gain: float
    tau_c_s: float
    ki: float
    nominal: Margins
    envelope: list = field(default_factory=list)

    @property
    def envelope_ok(self) -> bool:
        """Every envelope point stable and meeting the floors."""
        return all(r["meets_floors"] for r in self.envelope)

    def loop(self) -> DelayedLoop:
        """The nominal loop."""
        return margin_loop(self.ki, self.theta_s, self.window_s, gain=self.gain)

    def to_dict(self) -> dict:
        """Plain figures (worst-case margins over the envelope included)."""
        d = asdict(self)
        d["nominal"] = self.nominal.to_dict()
        d["envelope_ok"] = self.envelope_ok
        d["worst_gm"] = min(r["gain_margin"] for r in self.envelope)
        d["worst_pm_deg"] = min(abs(r["phase_margin_deg"]) for r in self.envelope)
        d["worst_dm_s"] = min(r["delay_margin_s"] for r in self.envelope)
        return d


def tune_margin_loop(theta_s: float, window_s: float, *, gain: float = MARGIN_GAIN,
                     delay_factors=(0.5, 1.0, 2.0), gain_factors=(0.25, 1.0, 4.0), gm_floor: float = 2.0,
                     pm_floor_deg: float = 45.0,
                     tau_c_factors=SIMC_TAU_C_FACTORS_WIDE) -> MarginLoopTuning:
    """SIMC for the outer loop: an integral controller on K e^{-theta s} / (tau_w s + 1), the lag
    counted as delay (an I controller cannot cancel it; Skogestad 2003, the half rule's limit),
    theta_eff = theta + tau_w, and ki = 1 / (K (tau_c + theta_eff)) (Table 1, integrating form),
    tau_c the first multiple of theta_eff whose loop is stable with GM >= ``gm_floor`` and
    |PM| >= ``pm_floor_deg`` at every (delay factor, gain factor) point of the envelope.

    Parameters
    ----------
    theta_s : float
        Delay from a margin change to its first outcomes (s, > 0).
    window_s : float
        Span of the quantile's window (s, >= 0).
    gain : float
        Nominal plant gain K.
    delay_factors, gain_factors : sequence of float
        The envelope.
    gm_floor, pm_floor_deg : float
        Margin floors.
    tau_c_factors : sequence of float
        Candidates (multiples of theta).

    Returns
    -------
    MarginLoopTuning

    Raises
    ------
    ConfigError
        When no candidate meets the floors.
    """
    check_number("outer.theta_s", theta_s, low=0.0, low_inclusive=False)
    check_number("outer.window_s", window_s, low=0.0)
    check_number("outer.gain", gain, low=0.0, low_inclusive=False)
    eff = theta_s + 0.5 * window_s
    points = [{"delay_factor": d, "gain_factor": k} for d in delay_factors for k in gain_factors]
    t = simc_search(eff, lambda f: 1.0 / (gain * (f * eff + eff)),
                    lambda ki: [margin_loop(ki, theta_s * p["delay_factor"], window_s, gain=gain * p["gain_factor"])
                                for p in points],
                    points, nominal_loop=lambda ki: margin_loop(ki, theta_s, window_s, gain=gain),
                    tau_c_factors=tau_c_factors, gm_floor=gm_floor, pm_floor_deg=pm_floor_deg, field="outer.ki")
    return MarginLoopTuning(theta_s, window_s, gain, t.tau_c_s, t.controller, t.nominal, t.envelope)


def tune_flat_margin_gain(ki: float, theta_s: float, window_s: float, *, sample_period_s: float = 5.0,
                          miss_setpoint: float = 0.8, flat_gain: float = FLAT_MARGIN_GAIN,
                          overshoot: float = FLAT_OVERSHOOT, delay_factors=(0.5, 1.0, 2.0),
                          gain_factors=(0.25, 1.0, 4.0), gm_floor: float = 2.0,
                          pm_floor_deg: float = 45.0) -> MarginLoopTuning:
    """The scheduled gain of the flat region (``MarginLoopConfig.ki_flat``) and its certificate:
    SIMC at the flat region's gain ``flat_gain`` (:func:`tune_margin_loop`), capped so the margin
    moves by at most ``overshoot`` over theta + half a sample while no miss can show yet
    (ki_flat <= overshoot / (miss_setpoint (theta + T / 2)): the error with no miss is the
    setpoint), and never below ``ki``; the margins are evaluated at that gain over the same delay
    x gain envelope around ``flat_gain`` (a capped gain only widens them).

    Parameters
    ----------
    ki : float
        The nominal gain (the floor of the scheduled one).
    theta_s, window_s : float
        The outer loop's delay and window span (s), as for :func:`tune_margin_loop`.
    sample_period_s : float
        T, the outer loop's sample period (s).
    miss_setpoint : float
        The setpoint's share of the budget (the error while the window holds no miss).
    flat_gain : float
        The flat region's plant gain (default :data:`FLAT_MARGIN_GAIN`).
    overshoot : float
        The cap's margin change per delay (default :data:`FLAT_OVERSHOOT`).
    delay_factors, gain_factors : sequence of float
        The envelope.
    gm_floor, pm_floor_deg : float
        Margin floors.

    Returns
    -------
    MarginLoopTuning
        ``ki`` is the scheduled gain; ``tau_c_s`` the closed-loop time constant it implies
        (1 / (K ki) - theta - tau_w).

    Raises
    ------
    ConfigError
        When the scheduled gain misses the floors somewhere on the envelope.
    """
    check_number("outer.ki", ki, low=0.0)
    check_number("outer.overshoot", overshoot, low=0.0, low_inclusive=False)
    check_number("outer.flat_gain", flat_gain, low=0.0, low_inclusive=False)
    simc = tune_margin_loop(theta_s, window_s, gain=flat_gain, delay_factors=delay_factors,
                            gain_factors=gain_factors, gm_floor=gm_floor, pm_floor_deg=pm_floor_deg)
    cap = overshoot / (miss_setpoint * (theta_s + 0.5 * sample_period_s))
    k = max(min(simc.ki, cap), ki)
    eff = theta_s + 0.5 * window_s
    points = [{"delay_factor": d, "gain_factor": g} for d in delay_factors for g in gain_factors]
    t = simc_search(eff, lambda f: k,
                    lambda ki_: [margin_loop(ki_, theta_s * p["delay_factor"], window_s,
                                             gain=flat_gain * p["gain_factor"]) for p in points],
                    points, nominal_loop=lambda ki_: margin_loop(ki_, theta_s, window_s, gain=flat_gain),
                    tau_c_factors=(1.0,), gm_floor=gm_floor, pm_floor_deg=pm_floor_deg, field="outer.ki_flat")
    tau_c = 1.0 / (flat_gain * k) - eff if k > 0 else math.inf
    return MarginLoopTuning(theta_s, window_s, flat_gain, tau_c, k, t.nominal, t.envelope)


def margin_separation(outer: MarginLoopTuning, fast: GateLoopTuning):
    """Separation of the outer margin loop from the fast gate's fill-limit loop: the fast loop's
    closed-loop bandwidth over the outer crossover, and the outer loop's margins with the fast
    closed loop (Pade model of its delay) in series
    (:func:`tokenfactory.controllers.separation.cascade_separation`).

    Parameters
    ----------
    outer : MarginLoopTuning
        The outer loop.
    fast : GateLoopTuning
        The fast gate's loop (``tune_slo_admission(...)["fill"]``).

    Returns
    -------
    CascadePair
    """
    from tokenfactory.controllers.separation import cascade_separation, closed_loop, closed_loop_bandwidth

    inner = slo_gate_loop(fast.ki, fast.theta_s, fast.gate_time_s, name="fast gate")
    return cascade_separation("outer margin", outer.loop(), "fast gate", closed_loop(inner),
                              inner_bandwidth_rad_s=closed_loop_bandwidth(inner),
                              note="the margin acts on the gate's limits; the gate's fill-limit loop closes within "
                                   "its bandwidth")
