"""NVIDIA Dynamo's own planner (the ``ai-dynamo`` package, unchanged) as a pool controller.

:class:`DynamoPlanner` drives the planner's zero-I/O core - ``OrchestratorEngineAdapter`` on a
``VirtualClock``, the path Dynamo's offline replay uses (``dynamo/planner/offline/
replay_adapter.py``) - from the plants' :class:`~tokenfactory.core.signals.Measurement`, tick by tick:

* engine capabilities (``WorkerCapabilities``) from the service model: a fill step's token budget
  (``max_num_batched_tokens``), the KV-limited decode slots (``max_num_seqs``), the request's
  context (``context_length``; the service model has no separate ``max_model_len``) and the decode
  KV tokens (slots x context, ``max_kv_tokens``);
* per-worker ``ForwardPassMetrics`` on every load tick, one per serving worker of each pool: the
  pool's queued prompt tokens, decoding sequences, their KV tokens and the ready requests waiting
  for a slot, split evenly over its serving workers (the Measurement is pool-level; both plants'
  workers of a pool are identical, the request simulator's per-worker spread is not measured);
  ``wall_time`` is the service model's pass time at that load;
* traffic windows (``TrafficObservation``) from the arrivals counted between the planner's
  traffic ticks (the frontend's count, before admission), ISL from the measured fill work;
* worker counts (``WorkerCounts``) with the serving workers as ready, the last target as expected
  and a scale in progress while the serving count has not reached it;
* ``effects.scale_to`` returned as one :class:`~tokenfactory.core.signals.ScaleAction` per pool, which
  the plant applies with its start-up, warm-up and drain.

Profile bootstrap (``sla`` mode; Dynamo's replay does the same with its AIC profiles): prefill
FPMs over a grid of step tokens and decode FPMs over a grid of batch x context, with the service
model's pass times as ``wall_time``.

The package is the ``dynamo`` extra (``pip install -e '.[dev]'`` installs it); without it the
constructor raises :class:`ConfigError`. Every result records the package versions that decided
(:func:`dynamo_versions`, in :meth:`DynamoPlanner.params`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Mapping
from typing import Any

from tokenfactory.controllers.interface import SampledController
from tokenfactory.core.signals import Measurement, ScaleAction
from tokenfactory.core.validation import ConfigError, check_choice, check_int

__all__ = ["DynamoPlanner", "DynamoCapabilities", "dynamo_versions", "planner_config", "PLANNER_MODES",
           "PLANNER_PREDICTORS"]

#: the planner modes the adapter sets up (Dynamo's ``optimization_target``): ``throughput`` is
#: Dynamo's default target (static queue/KV thresholds), ``load`` its user-threshold target,
#: ``sla`` the perf-model target with load scaling under a throughput lower bound, ``latency``
#: the tighter static thresholds
PLANNER_MODES = ("throughput", "load", "sla", "latency")
#: the load predictors of Dynamo's throughput scaling that the adapter is tested with
PLANNER_PREDICTORS = ("constant", "kalman", "arima")

#: PlannerConfig fields the adapter owns: the simulated environment, no servers, no reports
_FIXED = {"environment": "virtual", "mode": "disagg", "report_interval_hours": None, "live_dashboard_port": 0,
          "metric_reporting_prometheus_port": 0, "report_write_gzip_log": False}


def dynamo_versions() -> dict[str, str]:
    """The installed ``ai-dynamo`` and ``ai-dynamo-runtime`` versions (what decided a run).

    Raises
    ------
    ConfigError
        When the package is not installed (``pip install -e '.[dynamo]'``).
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        return {"ai-dynamo": version("ai-dynamo"), "ai-dynamo-runtime": version("ai-dynamo-runtime")}
    except PackageNotFoundError:
        raise ConfigError("autoscaler", "the dynamo-planner kind needs the 'dynamo' extra "
                          "(pip install -e '.[dynamo]': ai-dynamo and ai-dynamo-runtime 1.4.2)") from None


class DynamoCapabilities:
    """What the planner is told about one fill and one decode engine, from the service model.

    Parameters
    ----------
    prompt_tokens, output_tokens : float
        The nominal request (tokens).
    fill_token_budget : int
        Tokens one fill step takes (``max_num_batched_tokens``).
    decode_slots : float
        Sequences one decode worker holds at the nominal context (``max_num_seqs``).
    context_tokens : float
        The decoding sequences' nominal context (tokens; ``max_kv_tokens`` = slots x context).
    fill_step_s : callable
        ``fill_step_s(tokens) -> s``: one fill pass over that many new tokens.
    decode_pass_s : callable
        ``decode_pass_s(batch, context) -> s``: one decode pass.
    gpus_per_worker : int
        GPUs of one worker (``*_engine_num_gpu``; the prefill worker's when
        ``decode_gpus_per_worker`` is given).
    fill_rate_per_worker : float
        Nominal requests/s of one fill worker (the ISL of the traffic windows is the nominal prompt
        x this over the measured fill capacity per worker; NaN: always the nominal prompt).
    decode_gpus_per_worker : int, optional
        GPUs of one decode worker (``decode_engine_num_gpu``) when the pools differ; default
        ``gpus_per_worker``.
    """

    def __init__(self, prompt_tokens, output_tokens, fill_token_budget, decode_slots, context_tokens, fill_step_s,
                 decode_pass_s, gpus_per_worker, fill_rate_per_worker=math.nan, decode_gpus_per_worker=None):
        self.fill_rate_per_worker = float(fill_rate_per_worker)
        self.prompt_tokens = float(prompt_tokens)
        self.output_tokens = float(output_tokens)
        self.fill_token_budget = int(fill_token_budget)
        self.decode_slots = float(decode_slots)
        self.context_tokens = float(context_tokens)
        self.fill_step_s = fill_step_s
        self.decode_pass_s = decode_pass_s
        self.gpus_per_worker = int(gpus_per_worker)
        self.decode_gpus_per_worker = int(gpus_per_worker if decode_gpus_per_worker is None else decode_gpus_per_worker)

    @classmethod
    def from_context(cls, ctx) -> "DynamoCapabilities":
        """From a plant context: its service model's pass times when it carries one, else its
        fluid parameters (fill pass linear in tokens at the nominal prompt's latency; the roofline
        decode table over batch at the nominal context).

        Parameters
        ----------
        ctx : tokenfactory.registry.PlantContext
            The plant (``params``, ``service``, ``dynamics``).

        Returns
        -------
        DynamoCapabilities
        """
        p = ctx.params
        prompt = p.prompt_tokens if p.prompt_tokens > 0 else 1.0
        svc = ctx.service
        if svc is not None:
            ctx_tokens = float(svc.decode_context_tokens)
            return cls(prompt, p.output_tokens, svc.fill_token_budget, p.decode_slots_per_worker, ctx_tokens,
                       svc.fill_step_s, svc.decode_pass_s, ctx.dynamics.gpus("fill"), p.fill_rate_per_worker,
                       ctx.dynamics.gpus("decode"))
        ctx_tokens = float(p.decode_context_tokens if p.decode_context_tokens is not None
                           else prompt + p.output_tokens / 2)  # a compared field, not the provenance
        lat = p.fill_latency_s

        def fill_step_s(tokens):
            return lat * max(float(tokens), 1.0) / prompt

        def decode_pass_s(batch, context):
            return p.decode_step_s(float(batch))

        return cls(prompt, p.output_tokens, int(prompt), p.decode_slots_per_worker, ctx_tokens, fill_step_s,
                   decode_pass_s, ctx.dynamics.gpus("fill"), p.fill_rate_per_worker, ctx.dynamics.gpus("decode"))

    @property
    def max_kv_tokens(self) -> int:
        return int(self.decode_slots * self.context_tokens)

    def worker_capabilities(self):
        from dynamo.planner.core.types import EngineCapabilities, WorkerCapabilities

        ctx_len = int(round(self.prompt_tokens + self.output_tokens))
        fill = EngineCapabilities(num_gpu=self.gpus_per_worker, max_num_batched_tokens=self.fill_token_budget,
                                  max_num_seqs=max(int(self.decode_slots), 1), context_length=ctx_len,
                                  max_kv_tokens=self.max_kv_tokens)
        dec = EngineCapabilities(num_gpu=self.decode_gpus_per_worker, max_num_batched_tokens=self.fill_token_budget,
                                 max_num_seqs=max(int(self.decode_slots), 1), context_length=ctx_len,
                                 max_kv_tokens=self.max_kv_tokens)
        return WorkerCapabilities(prefill=fill, decode=dec)

    def profile_fpms(self):
        """Benchmark FPMs for the perf-model bootstrap: ``(prefill, decode)`` lists.

        Prefill: one request per step over 16 step sizes up to the token budget. Decode: 8 batches
        up to the slots x 4 contexts from a quarter of the nominal to the nominal one (KV tokens
        = batch x context, so the two regression features are not collinear)."""
        from dynamo.common.forward_pass_metrics import ForwardPassMetrics, ScheduledRequestMetrics

        pre = []
        for i in range(1, 17):
            n = max(int(round(self.fill_token_budget * i / 16)), 1)
            pre.append(ForwardPassMetrics(worker_id="profile", wall_time=float(self.fill_step_s(n)),
                                          scheduled_requests=ScheduledRequestMetrics(
                                              num_prefill_requests=1, sum_prefill_tokens=n)))
        dec = []
        top = max(int(self.decode_slots), 1)
        batches = sorted({max(int(round(top * f)), 1) for f in (1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 3 / 4, 1)})
        for b in batches:
            for f in (0.25, 0.5, 0.75, 1.0):
                c = max(self.context_tokens * f, 1.0)
                dec.append(ForwardPassMetrics(worker_id="profile", wall_time=float(self.decode_pass_s(b, c)),
                                              scheduled_requests=ScheduledRequestMetrics(
                                                  num_decode_requests=b, sum_decode_kv_tokens=int(b * c))))
        return pre, dec


def planner_config(mode: str = "throughput", predictor: str = "constant", *, overrides: Mapping[str, Any] | None = None,
                   capabilities: DynamoCapabilities | None = None, slo_ttft_s: float = 2.0, slo_tpot_s: float = 0.1,
                   max_replicas: int = 64):
    """Dynamo's ``PlannerConfig`` for a mode, validated by Dynamo's own model.

    ``throughput``: Dynamo's defaults. ``load``: ``optimization_target = "load"`` with the
    thresholds of :func:`tokenfactory.controllers.autoscaling.dynamo_load_thresholds`. ``sla``: load and throughput
    scaling, TTFT/ITL targets from the SLO, one FPM bucket (reproducible decisions; see the comment
    in the code). The GPU budget allows ``max_replicas`` workers per
    pool. ``overrides`` are Dynamo's own fields and win over all of these.

    Parameters
    ----------
    mode : str
        One of :data:`PLANNER_MODES` (default ``"throughput"``).
    predictor : str
        Dynamo's ``load_predictor`` (default ``"constant"``; ``"kalman"``, ``"arima"``, ``"prophet"``).
    overrides : mapping, optional
        Dynamo ``PlannerConfig`` fields (names or Dynamo's aliases); the adapter's own fields
        (:data:`_FIXED`: environment, mode, reports, servers) cannot be changed.
    capabilities : DynamoCapabilities, optional
        The engines (GPUs per worker, the fill step's tokens for the ``load`` thresholds).
    slo_ttft_s, slo_tpot_s : float
        The SLO (``sla``: ``ttft_ms``, ``itl_ms``; s, defaults 2 and 0.1).
    max_replicas : int
        Workers per pool the GPU budget allows (default 64).

    Returns
    -------
    PlannerConfig
        Dynamo's validated config object.

    Raises
    ------
    ConfigError
        For an unknown mode, predictor or config field, or a value Dynamo's validation rejects
        (field ``planner_config.<field>``).
    """
    check_choice("planner.mode", mode, PLANNER_MODES)
    from dynamo.planner.config.planner_config import PlannerConfig
    from pydantic import ValidationError

    gpus = capabilities.gpus_per_worker if capabilities is not None else 1
    dgpus = capabilities.decode_gpus_per_worker if capabilities is not None else 1
    # max_gpu_budget counts GPUs across both pools (_apply_global_budget): max_replicas workers of each
    d: dict[str, Any] = {**_FIXED, "optimization_target": mode, "load_predictor": predictor,
                         "pre_deployment_sweeping_mode": "none", "prefill_engine_num_gpu": gpus,
                         "decode_engine_num_gpu": dgpus, "max_gpu_budget": int(max_replicas) * (gpus + dgpus)}
    if mode == "load":
        from tokenfactory.controllers.autoscaling import dynamo_load_thresholds

        th = dynamo_load_thresholds(capabilities.fill_token_budget if capabilities is not None else 8192)
        d.update(prefill_scale_up_queue_tokens=int(th["fill"][0]), prefill_scale_down_queue_tokens=int(th["fill"][1]),
                 decode_scale_up_kv_rate=th["decode"][0], decode_scale_down_kv_rate=th["decode"][1])
    elif mode == "sla":
        # fpm_sample_bucket_size = 1 (Dynamo: 16): the Rust perf model's retained FPMs live in
        # buckets, and when the retention is full it evicts across buckets in an order that differs
        # between instances (hash order): five fresh planners fed the same 300 decode FPMs disagreed
        # on 93 % of their capacity estimates with 16 or 4 buckets and on none with one bucket (FIFO
        # eviction). One bucket keeps the decisions reproducible; set it back to see Dynamo's spread.
        d.update(enable_load_scaling=True, enable_throughput_scaling=True, ttft_ms=1000.0 * slo_ttft_s,
                 itl_ms=1000.0 * slo_tpot_s, fpm_sample_bucket_size=1)
    extra = dict(overrides or {})
    known = set()
    for name, f in PlannerConfig.model_fields.items():
        known.add(name)
        if f.validation_alias is not None and hasattr(f.validation_alias, "choices"):
            known.update(str(a) for a in f.validation_alias.choices)
    unknown = sorted(set(extra) - known)
    if unknown:
        raise ConfigError(f"planner_config.{unknown[0]}", "is not a field of Dynamo's PlannerConfig "
                          f"(dynamo/planner/config/planner_config.py)")
    owned = sorted(k for k in extra if k in _FIXED and extra[k] != _FIXED[k])
    if owned:
        raise ConfigError(f"planner_config.{owned[0]}", f"is set by the adapter to {_FIXED[owned[0]]!r} "
                          "(a simulated disaggregated deployment without servers or reports)")
    d.update(extra)
    check_choice("planner_config.load_predictor", d["load_predictor"], (*PLANNER_PREDICTORS, "prophet"))
    _say_once(logging.getLogger(PlannerConfig.__module__))
    try:
        return PlannerConfig.model_validate(d)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ())) or "planner_config"
        raise ConfigError(f"planner_config.{loc}" if loc != "planner_config" else loc, err.get("msg", str(e))) from None


class _OncePerMessage(logging.Filter):
    """Pass each distinct message once: Dynamo's config validation warns on every PlannerConfig it
    builds (e.g. "optimization_target='load' disables throughput-based scaling"), and advise builds
    one per candidate and pool - the user should read it once, not dozens of times."""

    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if msg in self.seen:
            return False
        self.seen.add(msg)
        return True


def _say_once(logger: logging.Logger) -> None:
    if not any(isinstance(f, _OncePerMessage) for f in logger.filters):
        logger.addFilter(_OncePerMessage())


class DynamoPlanner(SampledController):
    """Dynamo's planner (``ai-dynamo``, unchanged) sizing both pools.

    The plant calls :meth:`update` every ``scheduling.scale_interval_seconds`` of the config
    (Dynamo's pipeline cadence; 5 s by default); the planner's own schedule decides which of
    those ticks run load scaling (every ``load_adjustment_interval_seconds``) and throughput
    scaling (every ``throughput_adjustment_interval_seconds``).

    Parameters
    ----------
    capabilities : DynamoCapabilities
        The engines, from the service model.
    mode : str
        One of :data:`PLANNER_MODES` (default ``"throughput"``, Dynamo's default).
    predictor : str
        Dynamo's ``load_predictor`` (default ``"constant"``; ``"kalman"``, ``"arima"``; the
        planner's own default ``arima`` only applies through ``config``).
    config : mapping, optional
        Dynamo ``PlannerConfig`` fields over the mode's (see :func:`planner_config`).
    slo_ttft_s, slo_tpot_s : float
        The SLO (``sla`` mode's ``ttft_ms`` / ``itl_ms``).
    max_replicas : int
        Workers per pool the GPU budget allows (>= 1; default 64).
    """

    name = "dynamo-planner"

    def __init__(self, capabilities: DynamoCapabilities, mode: str = "throughput", predictor: str = "constant", *,
                 config: Mapping[str, Any] | None = None, slo_ttft_s: float = 2.0, slo_tpot_s: float = 0.1,
                 max_replicas: int = 64):
        self.versions = dynamo_versions()
        os.environ.setdefault("DYN_LOG", "error")
        self.caps = capabilities
        cfg = dict(config or {})
        # the config's own optimization_target and load_predictor name the mode and predictor
        mode = cfg.pop("optimization_target", mode)
        predictor = cfg.pop("load_predictor", predictor)
        self.mode = check_choice("planner.mode", mode, PLANNER_MODES)
        self.max_replicas = check_int("planner.max_replicas", max_replicas, low=1)
        self.overrides = cfg
        self.config = planner_config(mode, predictor, overrides=self.overrides, capabilities=capabilities,
                                     slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s, max_replicas=max_replicas)
        self.predictor = self.config.load_predictor
        super().__init__(float(self.config.scheduling.scale_interval_seconds))
        self._loop = None
        self.reset()

    # -- lifecycle

    def reset(self) -> None:
        """A fresh planner (its predictors, regressions and schedule) and traffic window."""
        from dynamo.planner.plugins.clock import VirtualClock
        from dynamo.planner.plugins.orchestrator.engine_adapter import OrchestratorEngineAdapter

        logging.getLogger("dynamo").setLevel(logging.ERROR)
        if self._loop is not None:
            self._loop.close()
        self._loop = asyncio.new_event_loop()
        self._engine = OrchestratorEngineAdapter(self.config, self.caps.worker_capabilities(), clock=VirtualClock())
        if self.mode == "sla":
            pre, dec = self.caps.profile_fpms()
            self._engine.install_regressions_from_fpms(prefill_fpms=pre, decode_fpms=dec)
        self._loop.run_until_complete(self._engine.bootstrap_plugins(historical_traffic=None))
        self._tick = None  # the planner's next scheduled tick (set on the first update)
        self._offset = 0.0  # plant time of the planner's time 0
        self._window_req = 0.0  # requests arrived since the last traffic observation
        self._window_isl = 0.0  # request-weighted prompt tokens of the window
        self._window_s = 0.0
        self._target = {"fill": None, "decode": None}
        self.decisions: list[dict] = []  # (time, tick kind, counts in, scale_to out), for tests and reports

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()
            self._loop = None

    # -- one sample

    def update(self, t: float, m: Measurement) -> list[ScaleAction]:
        """One pipeline tick at plant time ``t``: the Measurement as Dynamo's tick input, the
        planner's ``scale_to`` as scale actions (empty when it keeps the pools)."""
        from dynamo.planner.core.types import TickInput

        if self._tick is None:  # the planner's clock starts one interval before the first sample
            self._offset = t - self.sample_period
            self._tick = self._engine.initial_tick(0.0)
        # the traffic window: arrivals over this sample (the frontend counts offered requests)
        rate = m.arrival_rate if math.isfinite(m.arrival_rate) else m.admitted_rate
        n_req = max(rate, 0.0) * self.sample_period
        self._window_req += n_req
        self._window_isl += n_req * self._isl(m)
        self._window_s += self.sample_period
        tick = self._tick
        now = t - self._offset
        if now + 1e-6 < tick.at_s:
            return []
        counts = self._worker_counts(m) if tick.need_worker_states else None
        fpm = self._fpm(m) if tick.need_worker_fpm else None
        traffic = self._traffic(m) if tick.need_traffic_metrics else None
        effects = self._loop.run_until_complete(self._engine.tick(tick, TickInput(
            now_s=tick.at_s, traffic=traffic, worker_counts=counts, fpm_observations=fpm)))
        self._tick = effects.next_tick
        out = []
        st = effects.scale_to
        if st is not None:
            for pool, n in (("fill", st.num_prefill), ("decode", st.num_decode)):
                if n is not None:
                    n = int(min(max(int(n), 1), self.max_replicas))
                    self._target[pool] = n
                    out.append(ScaleAction(pool, n))
        dg = effects.diagnostics
        self.decisions.append({"time_s": t, "load": tick.run_load_scaling, "throughput": tick.run_throughput_scaling,
                               "fill_workers": m.fill_workers, "decode_workers": m.decode_workers,
                               "fill_to": st.num_prefill if st else None, "decode_to": st.num_decode if st else None,
                               "load_reason": dg.load_decision_reason,
                               "throughput_reason": dg.throughput_decision_reason,
                               "predicted_num_req": dg.predicted_num_req,
                               "engine_rps_prefill": dg.engine_rps_prefill, "engine_rps_decode": dg.engine_rps_decode,
                               "estimated_ttft_ms": dg.estimated_ttft_ms, "estimated_itl_ms": dg.estimated_itl_ms})
        return out

    # -- Measurement -> Dynamo's tick input

    def _isl(self, m: Measurement) -> float:
        """Prompt tokens per request now: the nominal prompt x the fill work per request the plant
        measures (its fill capacity per worker relative to the nominal)."""
        nominal = self.caps.fill_rate_per_worker
        if m.fill_capacity > 0 and m.fill_workers > 0 and math.isfinite(nominal) and nominal > 0:
            return self.caps.prompt_tokens * nominal * m.fill_workers / m.fill_capacity
        return self.caps.prompt_tokens

    def _worker_counts(self, m: Measurement):
        from dynamo.planner.core.types import WorkerCounts

        ready = {"fill": int(round(_finite(m.fill_workers))), "decode": int(round(_finite(m.decode_workers)))}
        provisioned = {"fill": ready["fill"] + int(round(m.fill_workers_starting)),
                       "decode": ready["decode"] + int(round(m.decode_workers_starting))}
        expected, moving = {}, {}
        for pool in ("fill", "decode"):
            tgt = self._target[pool]
            if tgt is not None and tgt == ready[pool] and provisioned[pool] == ready[pool]:
                self._target[pool] = tgt = None  # reached
            expected[pool] = tgt if tgt is not None else provisioned[pool]
            moving[pool] = expected[pool] != ready[pool]
        return WorkerCounts(ready_num_prefill=ready["fill"], ready_num_decode=ready["decode"],
                            expected_num_prefill=expected["fill"], expected_num_decode=expected["decode"],
                            prefill_scaling_in_progress=moving["fill"], decode_scaling_in_progress=moving["decode"])

    def _fpm(self, m: Measurement):
        """One ForwardPassMetrics per serving worker: the pool's load split evenly."""
        from dynamo.common.forward_pass_metrics import ForwardPassMetrics, QueuedRequestMetrics, ScheduledRequestMetrics
        from dynamo.planner.core.types import FpmObservations

        caps = self.caps
        nf = max(int(round(_finite(m.fill_workers))), 0)
        nd = max(int(round(_finite(m.decode_workers))), 0)
        prefill, decode = {}, {}
        if nf:
            tokens = m.fill_queued_tokens if math.isfinite(m.fill_queued_tokens) else \
                m.fill_in_progress * caps.prompt_tokens
            per = max(tokens, 0.0) / nf
            sched = min(per, float(caps.fill_token_budget))
            queued = per - sched
            n_sched = sched / caps.prompt_tokens
            n_queued = queued / caps.prompt_tokens
            wall = float(caps.fill_step_s(sched)) if sched > 0 else 0.0
            for i in range(nf):
                prefill[(f"fill-{i}", 0)] = ForwardPassMetrics(
                    worker_id=f"fill-{i}", wall_time=wall,
                    scheduled_requests=ScheduledRequestMetrics(num_prefill_requests=int(math.ceil(n_sched)),
                                                               sum_prefill_tokens=int(round(sched))),
                    queued_requests=QueuedRequestMetrics(num_prefill_requests=int(math.ceil(n_queued)),
                                                         sum_prefill_tokens=int(round(queued))))
        if nd:
            ctx = m.decode_context_tokens if math.isfinite(m.decode_context_tokens) else caps.context_tokens
            active = max(m.active_decodes, 0.0) / nd
            waiting = max(m.ready, 0.0) / nd
            if active > 0:
                wall = m.decode_pass_s if math.isfinite(m.decode_pass_s) else float(caps.decode_pass_s(active, ctx))
            else:
                wall = 0.0
            for i in range(nd):
                decode[(f"decode-{i}", 0)] = ForwardPassMetrics(
                    worker_id=f"decode-{i}", wall_time=float(wall),
                    scheduled_requests=ScheduledRequestMetrics(num_decode_requests=int(round(active)),
                                                               sum_decode_kv_tokens=int(round(active * ctx))),
                    # a ready request holds its prompt's KV while it waits for a slot
                    queued_requests=QueuedRequestMetrics(num_decode_requests=int(round(waiting)),
                                                         sum_decode_kv_tokens=int(round(waiting * caps.prompt_tokens))))
        return FpmObservations(prefill=prefill or None, decode=decode or None)

    def _traffic(self, m: Measurement):
        from dynamo.planner.core.types import TrafficObservation

        n, dur = self._window_req, self._window_s
        isl = self._window_isl / n if n > 0 else self.caps.prompt_tokens
        self._window_req = self._window_isl = self._window_s = 0.0
        if dur <= 0:
            return None
        return TrafficObservation(duration_s=dur, num_req=n, isl=isl, osl=self.caps.output_tokens)

    def params(self) -> dict:
        return {"kind": self.name, "mode": self.mode, "predictor": self.predictor, "sample_period": self.sample_period,
                "max_replicas": self.max_replicas, "planner_config_overrides": dict(self.overrides),
                "package": "ai-dynamo", "versions": dict(self.versions)}


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0
