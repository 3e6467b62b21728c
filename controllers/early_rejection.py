"""Admission baselines from today's serving systems: Mooncake's early rejection (current-load and
prediction-based) and vLLM's watermark admission.

* :class:`EarlyRejection` - Mooncake (Qin et al., "Mooncake: A KVCache-centric Disaggregated
  Architecture for LLM Serving", FAST '25 / arXiv:2407.00079, sec. 7 "Overload-oriented
  scheduling"): the conductor rejects a request *at arrival* when it predicts the request would
  break its SLO - TTFT from the prefill queue it would join, TBT from the load of the decode
  instances. With ``predictive=False`` the decode load is the one measured now (sec. 7.2, "early
  rejection"); the paper shows this makes prefill and decode load swing in anti-phase (sec. 7.3),
  because a request admitted now reaches decode only after its prefill. ``predictive=True`` is
  the paper's fix (sec. 7.4, "early rejection based on prediction"): the decode load is predicted
  at the time the request would reach decode - sequences now decoding or waiting, plus those in
  prefill and queued for it, minus the completions expected over the prefill horizon.
* :class:`WatermarkAdmission` - vLLM's scheduler (``BlockSpaceManager.can_allocate``,
  ``watermark=0.01``): a waiting request is scheduled only while the KV blocks it needs leave at
  least 1 % of blocks free; nothing is rejected, the rest waits. At the orchestrator this gates
  the release of the backlog on the KV the admitted work will hold.

All three are :class:`tokenfactory.controllers.interface.SampledController` objects returning
:class:`tokenfactory.core.signals.AdmissionAction`, so they run in the fluid model, the pool model
and the request simulator unchanged. Rejection at arrival is ``backlog_bound=0`` with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from tokenfactory.controllers.interface import SampledController
from tokenfactory.core.signals import AdmissionAction, Measurement
from tokenfactory.core.validation import check_number

__all__ = ["EarlyRejection", "WatermarkAdmission", "RejectionSeesaw", "predict_rejection_seesaw"]


@dataclass(frozen=True)
class RejectionSeesaw:
    """The decode-load cycle early rejection on a delayed decode load settles into.

    Parameters
    ----------
    period_s : float
        Time between two switches from rejecting to admitting (s).
    swing : float
        Peak-to-peak swing of the decode load (sequences per decode slot).
    delay_s : float
        The loop's delay: a request admitted now reaches decode after it (s).
    """

    period_s: float
    swing: float
    delay_s: float

    @property
    def amplitude(self) -> float:
        """sqrt(2) x the RMS of the triangle wave (the oscillation test's amplitude)."""
        return self.swing / 2.0 * math.sqrt(2.0 / 3.0)

    def to_dict(self) -> dict:
        return {"period_s": self.period_s, "swing": self.swing, "amplitude": self.amplitude,
                "delay_s": self.delay_s}


def predict_rejection_seesaw(demand_rps: float, decode_rps: float, decode_slots: float, delay_s: float,
                             min_amplitude: float = 0.02) -> RejectionSeesaw | None:
    """The cycle of admission that rejects on the decode load while the admitted work reaches
    decode ``delay_s`` later (Mooncake sec. 7.3's seesaw), or None when it is too small to matter.

    The decode load integrates admitted arrivals minus completions; the rule is a relay on it
    (admit all at ``demand_rps``, or none) acting through a pure delay. Between switches each slope
    runs on for the delay after the load crosses the threshold: rising at a = demand - decode rate
    it overshoots by a x delay, falls back at b = decode rate and undershoots by b x delay. One
    period is delay + (a / b) delay + delay + (b / a) delay = delay (2 + a / b + b / a), the swing
    (a + b) delay sequences (the classic relay-with-delay cycle on an integrator, made asymmetric by
    the two slopes). With ``demand_rps`` at or below ``decode_rps`` nothing is rejected: no cycle.

    Parameters
    ----------
    demand_rps, decode_rps : float
        Offered requests/s and what the decode pool completes at full load (> 0).
    decode_slots : float
        Decode slots of the pool (sequences, > 0): the unit of the load.
    delay_s : float
        Admission to decode arrival (the prefill, with its queue), plus the load's age and half a
        sample (s, > 0).
    min_amplitude : float
        Amplitude (sqrt(2) x RMS, load units) below which no cycle is reported (default 0.02, the
        floor the seesaw's oscillation test uses, :func:`tokenfactory.controllers.oscillation.assess`).

    Returns
    -------
    RejectionSeesaw or None
    """
    for name, v in (("demand_rps", demand_rps), ("decode_rps", decode_rps), ("decode_slots", decode_slots),
                    ("delay_s", delay_s)):
        check_number(f"seesaw.{name}", v, low=0.0, low_inclusive=False)
    if demand_rps <= decode_rps:
        return None
    a, b = demand_rps - decode_rps, decode_rps
    cycle = RejectionSeesaw(delay_s * (2.0 + a / b + b / a), (a + b) * delay_s / decode_slots, delay_s)
    return cycle if cycle.amplitude >= min_amplitude else None


class EarlyRejection(SampledController):
    """Reject at arrival when the predicted TTFT exceeds ``slo_ttft_s`` (reason
    ``predicted_slo_violation``) or the (predicted) decode load reaches ``decode_threshold`` of
    the decode slots (``decode_overloaded``; at 1.0 every slot is taken and a new sequence would
    wait, stretching its TBT). ``decode_step_s`` (batch per worker -> pass seconds), if given, also
    rejects when the pass time at the predicted batch exceeds ``slo_tpot_s``.

    Admitted requests are released at once (rate ``inf``); a rejection sheds the whole backlog
    (``backlog_bound=0``), i.e. every request arriving until the next sample.

    Parameters
    ----------
    fill_latency_s : float
        Time one request spends in prefill with no queue (s, >= 0; the registry passes the
        roofline's ``FluidParams.fill_latency_s``): its own contribution to the predicted TTFT.
    slo_ttft_s : float
        Time-to-first-token SLO (s, > 0; default 2.0).
    decode_threshold : float
        Decode load, in sequences per decode slot, at which arrivals are rejected
        ([0.1, 10]; default 1.0, every slot taken).
    predictive : bool
        False (default): the decode load measured now (Mooncake sec. 7.2); True: the load
        predicted for when a request admitted now reaches decode (sec. 7.4).
    slo_tpot_s : float
        Time-per-output-token SLO (s, > 0; default 0.1); used only with ``decode_step_s``.
    decode_step_s : callable, optional
        ``decode_step_s(batch) -> s``: a decode worker's pass time at a batch of ``batch``
        sequences (e.g. from the roofline). Default None: no TPOT check.
    sample_period : float
        Seconds between decisions (> 0; default 0.5).
    """

    name = "early-rejection"

    def __init__(self, *, fill_latency_s: float, slo_ttft_s: float = 2.0, decode_threshold: float = 1.0,
                 predictive: bool = False, slo_tpot_s: float = 0.1,
                 decode_step_s: Callable[[float], float] | None = None, sample_period: float = 0.5):
        super().__init__(sample_period)
        self.fill_latency_s = check_number("early_rejection.fill_latency_s", fill_latency_s, low=0.0)
        self.slo_ttft_s = check_number("early_rejection.slo_ttft_s", slo_ttft_s, low=0.0, low_inclusive=False)
        self.decode_threshold = check_number("early_rejection.decode_threshold", decode_threshold, low=0.1, high=10.0)
        self.slo_tpot_s = check_number("early_rejection.slo_tpot_s", slo_tpot_s, low=0.0, low_inclusive=False)
        self.predictive = bool(predictive)
        self.decode_step_s = decode_step_s

    def predicted_ttft(self, m: Measurement) -> float:
        """Prefill queue it would join / prefill throughput + its own prefill.

        Parameters
        ----------
        m : Measurement
            The (delayed) sample of the plant.

        Returns
        -------
        float
            Predicted time to first token (s): (backlog + fill in progress) / fill capacity +
            ``fill_latency_s``; inf without fill capacity.
        """
        if m.fill_capacity <= 0:
            return math.inf
        return (m.backlog + m.fill_in_progress) / m.fill_capacity + self.fill_latency_s

    def predicted_decode_load(self, m: Measurement) -> float:
        """Sequences holding or waiting for a decode slot, per slot - now, or (predictive) when a
        request admitted now would reach decode.

        Parameters
        ----------
        m : Measurement
            The (delayed) sample of the plant.

        Returns
        -------
        float
            (active decodes + ready) / decode slots; predictive: plus fill in progress and
            backlog, minus completion rate x predicted TTFT, floored at 0, per slot. inf
            without decode slots.
        """
        if m.decode_slots <= 0:
            return math.inf
        load = m.active_decodes + m.ready
        if self.predictive:
            horizon = self.predicted_ttft(m)
            horizon = horizon if math.isfinite(horizon) else 0.0
            load = max(load + m.fill_in_progress + m.backlog - m.completion_rate * horizon, 0.0)
        return load / m.decode_slots

    def update(self, t: float, m: Measurement) -> AdmissionAction:
        """Admit everything, or reject arrivals until the next sample with the reason.

        Parameters
        ----------
        t : float
            Plant time (s).
        m : Measurement
            The (delayed) sample of the plant.

        Returns
        -------
        AdmissionAction
            ``rate=inf``; with ``backlog_bound=0`` and ``predicted_slo_violation`` or
            ``decode_overloaded`` when rejecting.
        """
        if self.predicted_ttft(m) > self.slo_ttft_s:
            return AdmissionAction(math.inf, 0.0, "predicted_slo_violation")
        load = self.predicted_decode_load(m)
        if load >= self.decode_threshold:
            return AdmissionAction(math.inf, 0.0, "decode_overloaded")
        if self.decode_step_s is not None and m.decode_workers > 0 and math.isfinite(m.decode_workers):
            batch = min(load, 1.0) * m.decode_slots / m.decode_workers
            if self.decode_step_s(batch) > self.slo_tpot_s:
                return AdmissionAction(math.inf, 0.0, "predicted_slo_violation")
        return AdmissionAction(math.inf)

    def params(self) -> dict:
        return {"fill_latency_s": self.fill_latency_s, "slo_ttft_s": self.slo_ttft_s,
                "decode_threshold": self.decode_threshold, "predictive": self.predictive,
                "slo_tpot_s": self.slo_tpot_s, "sample_period": self.sample_period}


class WatermarkAdmission(SampledController):
    """Release the backlog at the fill capacity while the KV of everything admitted (decoding,
    ready, in fill) stays under (1 - ``watermark``) of the decode slots; hold it otherwise.

    Nothing is rejected here: held requests wait in the backlog.

    Parameters
    ----------
    watermark : float
        Fraction of decode slots kept free ([0, 0.5]; default 0.01, vLLM's 1 %).
    sample_period : float
        Seconds between decisions (> 0; default 0.1).
    """

    name = "vllm-watermark"

    def __init__(self, watermark: float = 0.01, sample_period: float = 0.1):
        super().__init__(sample_period)
        self.watermark = check_number("watermark.watermark", watermark, low=0.0, high=0.5)

    def update(self, t: float, m: Measurement) -> AdmissionAction:
        """The admission rate that fills the remaining room within one sample.

        Parameters
        ----------
        t : float
            Plant time (s).
        m : Measurement
            The (delayed) sample of the plant.

        Returns
        -------
        AdmissionAction
            ``rate`` = min(fill capacity, room / sample period + completion rate) requests/s,
            where room = (1 - watermark) x decode slots - (decoding + ready + in fill); 0
            without room.
        """
        held = m.active_decodes + m.ready + m.fill_in_progress
        room = (1.0 - self.watermark) * m.decode_slots - held
        if room <= 0:
            return AdmissionAction(0.0)
        # vLLM admits whenever KV frees, within a scheduler step: over one sample that is the room
        # left now plus what completions free meanwhile (room / T alone settles T x completions
        # below the watermark - 15 % of the slots idle at a 2 s sample), and no faster than fill takes
        completions = m.completion_rate if m.completion_rate == m.completion_rate else 0.0
        return AdmissionAction(min(m.fill_capacity, room / self.sample_period + max(completions, 0.0)))

    def params(self) -> dict:
        return {"watermark": self.watermark, "sample_period": self.sample_period}
