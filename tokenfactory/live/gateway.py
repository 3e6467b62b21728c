"""The admission gateway: an asyncio reverse proxy running the registry's admission controller.

``tokenfactory gateway --upstream URL [--upstream URL ...] --scenario FILE --port P`` proxies
``/v1/completions`` and ``/v1/chat/completions`` to the upstream engines (streams pass through
chunk by chunk as the upstream writes them) and decides on each request before it is sent, with
the controller object the simulators run (built by :meth:`LiveScenario.build_admission`, i.e.
through :mod:`tokenfactory.registry`).

What the controller sees (:class:`tokenfactory.core.signals.Measurement`, one per sample period):

* the upstreams' ``/metrics`` scraped every ``live.scrape_interval_s`` (vLLM's
  ``num_requests_running`` / ``num_requests_waiting``; the emulator's per-stage counts and worker
  counts when present), stamped with the scrape time less the scenario's measurement delay (how
  late the upstream publishes) - so the controller's own ledger of what it admitted since then
  is the in-flight credit of gateway-api-inference-extension PR #2066 (requests dispatched since
  the metrics were produced count against the backend at once);
* its own counts: requests it holds (backlog, deferred), arrival, admission and completion rates
  over the sample;
* the quantities the request simulator's measurement holds, when the upstream publishes them (the
  emulator: ``tokenfactory:emulator_fill_queued_tokens``, the prompt tokens still to prefill, and
  ``tokenfactory:emulator_decode_pass_seconds``, the busy decode workers' pass time now), so the
  controller sees on the wire what it sees in simulation. Otherwise (vLLM) the queued tokens are
  the waiting requests x their prompt, and the pass time is the streams' own: the mean gap from a
  stream's second token to its last over the streams finished in the sample (the last value held
  through a sample without one). A whole request's TPOT would also carry its wait for a decode
  slot after the first token and overstate the pass time at saturation (before, the gateway fed
  that TPOT, the controller's default pass time in a sample with none, and counted transferring
  and half-prefilled requests with their whole prompt: figures the simulator's gate never sees).

Decisions. A controller with ``decide`` (SLO-aware admission) answers each arrival: admit, defer
(held, offered again at every sample until the class's ``max_defer_s``) or reject. Any other
controller commands a rate and a backlog bound: arrivals queue at the gateway and leave at the
rate (a token bucket of one sample), and are rejected beyond the bound. A rejection is a 429 with
``Retry-After`` and the reason in the body and the ``x-tokenfactory-reason`` header. A batch-cap
action is sent to upstreams that accept it (the emulator's ``/tokenfactory/batch_cap``) and shown
in ``/metrics`` either way.

Fail closed. An upstream whose last scrape failed takes no requests; with none healthy, arrivals
are rejected with 503 (``upstream_unavailable``); a request the upstream drops is counted as
``failed_upstream`` (502 when nothing was sent yet). Every request is counted once when it ends:
completed, rejected (with its reason), or failed upstream; ``in_flight`` and ``held`` cover the
rest, and :meth:`Gateway.accounting` checks the sum.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import deque

import aiohttp
from aiohttp import web

from tokenfactory.core.errors import ConfigError
from tokenfactory.live.emulator import request_tokens
from tokenfactory.live.exposition import Registry, parse_text, sample_value
from tokenfactory.live.live_scenario import CLASS_HEADER, LiveScenario
from tokenfactory.core.signals import REJECT_REASONS, AdmissionAction, Arrival, BatchCapAction, Measurement, sort_actions

__all__ = ["Gateway", "GATEWAY_KEY", "gateway_app", "GATEWAY_REJECT_REASONS", "REASON_HEADER"]

#: why the gateway turns a request away: the controllers' reasons plus the gateway's own
GATEWAY_REJECT_REASONS = (*REJECT_REASONS, "upstream_unavailable", "bad_request")
#: the response header naming a rejection's reason
REASON_HEADER = "x-tokenfactory-reason"
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade", "te", "trailer",
        "proxy-authorization", "proxy-authenticate", "content-encoding"}


class _Upstream:
    __slots__ = ("url", "healthy", "samples", "scraped_s", "in_flight", "failures", "accepts_cap")

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.healthy = False
        self.samples: list = []
        self.scraped_s = -math.inf
        self.in_flight = 0
        self.failures = 0
        self.accepts_cap = True


class Gateway:
    """The gateway's state: upstreams, the controller, the held requests and the counters.

    Parameters
    ----------
    scenario : LiveScenario
        The scenario (controller kind and parameters, SLOs, classes, pools, ``[live]``).
    upstreams : list of str
        Base URLs of the engines (``http://127.0.0.1:8000``).
    controller : object, optional
        An admission controller to run instead of the scenario's (tests, benchmarks); ``None``
        builds the scenario's. Pass ``open_gate=True`` to proxy without admission control.
    open_gate : bool
        Admit everything (the overhead benchmark's bare-proxy comparison uses a plain proxy; this
        is the gateway with its bookkeeping but no decisions).
    request_log : str, optional
        A file to append one JSON line per finished request to: ``class``, ``status``
        (``completed``, ``rejected``, ``failed_upstream``), ``reason``, ``arrived_unix_s``,
        ``sent_unix_s``, ``first_token_unix_s``, ``end_unix_s``, ``prompt_tokens``, ``chunks``,
        ``request_id`` (the client's ``x-request-id`` header, or null) and ``deferred`` (held for a
        later sample before its decision): what separates the client's lateness, the gateway's
        decision time and the upstream's time when a run is taken apart.
    """

    def __init__(self, scenario: LiveScenario, upstreams: list[str], controller=None, open_gate: bool = False,
                 request_log: str | None = None):
        if not upstreams:
            raise ConfigError("upstream", "the gateway needs at least one upstream URL")
        self.sc = scenario
        self.upstreams = [_Upstream(u) for u in upstreams]
        self.ctrl = None if open_gate else (controller if controller is not None else scenario.build_admission())
        self.gate = getattr(self.ctrl, "decide", None)
        self.period = float(getattr(self.ctrl, "sample_period", 0.25) or 0.25)
        self.scrape_s = float(scenario.live["scrape_interval_s"])
        self.delay_s = float(scenario.cluster.measurement_delay_s)
        self.classes = {c.name: c for c in scenario.cluster.classes} if scenario.cluster.classes else {}
        ctx = scenario.context()
        self.class_names = list(ctx.class_table())
        self.top = self.class_names[0]
        self.max_defer = {n: (c.max_defer_s if c.deferrable else 0.0) for n, c in ctx.class_table().items()}
        fp = scenario.setup.plant.params
        self.nominal_output = float(scenario.live["output_tokens"])
        self.kv_slots_per_worker = float(fp.decode_slots_per_worker)
        self.fill_rps_per_worker = float(fp.fill_rate_per_worker)
        self.action = AdmissionAction(math.inf)
        self.batch_cap: float = math.nan
        self.t0 = time.monotonic()
        self.session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task] = []
        self.sample_event = asyncio.Event()
        # own counts
        self.backlog: deque = deque()       # rate controllers: (future) waiting for a token
        self.held = 0                       # deferred, waiting for the next sample
        self._was_held: set = set()         # ids of arrivals being decided that were deferred once
        self.in_flight = 0                  # sent upstream, not finished
        self.prefilling = 0                 # sent, no first token yet
        self.prefill_tokens = 0             # their prompt tokens
        self.decoding = 0                   # first token seen, not finished
        self.received = 0
        self.deciding = 0                   # received, neither sent upstream nor ended (held included)
        self.arrived_since = self.admitted_since = self.completed_since = 0
        self.tpot_sum = 0.0
        self.tpot_n = 0
        self.tokens = 0.0
        self.token_t = 0.0
        self.last_m: Measurement | None = None
        self.predicted_ttft: float = math.nan
        r = self.metrics = Registry()
        self.c_requests = r.counter("tokenfactory:gateway_requests", "Requests received.", ("request_class",))
        self.c_admitted = r.counter("tokenfactory:gateway_admitted", "Requests admitted and sent upstream.",
                                    ("request_class",))
        self.c_rejected = r.counter("tokenfactory:gateway_rejected", "Requests rejected, by reason.",
                                    ("request_class", "reason"))
        self.c_deferred = r.counter("tokenfactory:gateway_deferred", "Deferrals (a request held for a later "
                                    "sample; counted once per request).", ("request_class",))
        self.c_completed = r.counter("tokenfactory:gateway_completed", "Requests the upstream completed.",
                                     ("request_class",))
        self.c_failed = r.counter("tokenfactory:gateway_failed_upstream", "Requests the upstream dropped or "
                                  "refused after admission.", ("request_class",))
        self.g_in_flight = r.gauge("tokenfactory:gateway_in_flight", "Requests sent upstream and not finished.")
        self.g_held = r.gauge("tokenfactory:gateway_held", "Requests held at the gateway (deferred or queued).")
        self.g_pred = r.gauge("tokenfactory:gateway_predicted_ttft_seconds", "Predicted TTFT of the last "
                              "request decided (s).")
        self.g_rate = r.gauge("tokenfactory:gateway_admission_rate", "The controller's commanded admission rate "
                              "(requests/s; +Inf: no limit).")
        self.g_bound = r.gauge("tokenfactory:gateway_backlog_bound", "The controller's backlog bound (requests).")
        self.g_cap = r.gauge("tokenfactory:gateway_batch_cap", "The batch gate's decode batch cap (sequences per "
                             "worker; NaN without a gate).")
        self.g_limit = r.gauge("tokenfactory:gateway_fill_wait_limit_seconds", "The SLO-aware gate's fill-wait "
                               "limit (s; NaN for other controllers).")
        self.g_healthy = r.gauge("tokenfactory:gateway_upstream_healthy", "1 when the upstream's last scrape "
                                 "succeeded.", ("upstream",))
        self.g_prefill = r.gauge("tokenfactory:gateway_prefilling", "Requests sent upstream with no first token "
                                 "yet (the gateway's own count).")
        self.g_prefill.set_function(lambda: self.prefilling)
        self.g_tpot = r.gauge("tokenfactory:gateway_measured_tpot_seconds", "The decode pass time the controller "
                              "saw in the last sample (s; the upstream's, else the streams' gaps after their "
                              "second token).")
        self.g_in_flight.set_function(lambda: self.in_flight)
        self.g_held.set_function(lambda: self.held + len(self.backlog))
        self.g_pred.set_function(lambda: self.predicted_ttft)
        self.g_rate.set_function(lambda: self.action.rate)
        self.g_bound.set_function(lambda: self.action.backlog_bound)
        self.g_cap.set_function(lambda: self.batch_cap)
        self.g_limit.set_function(lambda: self.ctrl.fill_limit() if hasattr(self.ctrl, "fill_limit") else math.nan)
        self._last_tpot = math.nan
        self.g_tpot.set_function(lambda: self._last_tpot)
        for u in self.upstreams:
            self.g_healthy.set_function(lambda u=u: 1.0 if u.healthy else 0.0, {"upstream": u.url})
        self.ended = {"completed": 0, "rejected": 0, "failed_upstream": 0}
        self.log = open(request_log, "a", buffering=1 << 16) if request_log else None
        self.unix0 = time.time() - self.now()

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- accounting ---------------------------------------------------------------------------
    def accounting(self) -> dict:
        """Every request received is completed, rejected, failed upstream, in flight or held.

        Returns
        -------
        dict
            The counts and ``balanced`` (the conservation law holds).
        """
        d = {"received": self.received, **self.ended, "in_flight": self.in_flight,
             "held": self.held + len(self.backlog), "deciding": self.deciding}
        d["balanced"] = self.received == sum(self.ended.values()) + self.in_flight + self.deciding
        return d

    # -- loops --------------------------------------------------------------------------------
    async def start(self) -> None:
        """Open the client session and start the scrape and control loops."""
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=2.0),
                                             connector=aiohttp.TCPConnector(limit=0))
        await self._scrape_all()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._scrape_loop()), loop.create_task(self._control_loop())]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass
        if self.session is not None:
            await self.session.close()
        if self.log is not None:
            self.log.close()
            self.log = None

    def _log(self, cls: str, status: str, reason: str, arrived: float, sent: float = math.nan,
             first: float = math.nan, prompt: int = 0, chunks: int = 0, request_id: str | None = None,
             deferred: bool = False) -> None:
        if self.log is None:
            return
        u = self.unix0
        self.log.write(json.dumps({"class": cls, "status": status, "reason": reason, "arrived_unix_s": u + arrived,
                                   "sent_unix_s": u + sent, "first_token_unix_s": u + first,
                                   "end_unix_s": u + self.now(), "prompt_tokens": prompt, "chunks": chunks,
                                   "request_id": request_id, "deferred": deferred}) + "\n")

    async def _scrape_one(self, u: _Upstream) -> None:
        try:
            async with self.session.get(u.url + "/metrics", timeout=aiohttp.ClientTimeout(total=max(
                    1.0, 4 * self.scrape_s))) as r:
                if r.status != 200:
                    raise aiohttp.ClientError(f"status {r.status}")
                text = await r.text()
            u.samples = parse_text(text)
            u.scraped_s = self.now()
            u.healthy = True
            u.failures = 0
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
            u.failures += 1
            u.healthy = False  # fail closed: no requests to an upstream we cannot see

    async def _scrape_all(self) -> None:
        await asyncio.gather(*(self._scrape_one(u) for u in self.upstreams))

    async def _scrape_loop(self) -> None:
        while True:
            await asyncio.sleep(self.scrape_s)
            await self._scrape_all()

    def measurement(self) -> Measurement:
        """What the controller sees now (module notes)."""
        t = self.now()
        T = self.period
        ups = [u for u in self.upstreams if u.healthy and u.samples]
        fill_q = ready = decoding = tokens = 0.0
        fill_w = dec_w = 0.0
        passes = []
        prompt = float(self.sc.live["prompt_tokens"])
        stamp = min((u.scraped_s for u in ups), default=t) - self.delay_s
        for u in ups:
            s = u.samples
            st = {k: sample_value(s, "tokenfactory:emulator_requests", stage=k) for k in
                  ("fill_queue", "prefilling", "transfer", "ready", "decoding")}
            if st["decoding"] == st["decoding"]:  # the emulator's stage counts
                fill_q += st["fill_queue"] + st["prefilling"] + st["transfer"]
                ready += st["ready"]
                decoding += st["decoding"]
                tok = sample_value(s, "tokenfactory:emulator_fill_queued_tokens")
                tokens += tok if tok == tok else (st["fill_queue"] + st["prefilling"]) * prompt
                ps = sample_value(s, "tokenfactory:emulator_decode_pass_seconds")
                if ps == ps:
                    passes.append(ps)
            else:  # a vLLM server: running sequences decode, waiting ones wait for prefill
                decoding += sample_value(s, "vllm:num_requests_running", 0.0)
                waiting = sample_value(s, "vllm:num_requests_waiting", 0.0)
                fill_q += waiting
                tokens += waiting * prompt
            fw = sample_value(s, "tokenfactory:emulator_workers", pool="fill")
            dw = sample_value(s, "tokenfactory:emulator_workers", pool="decode")
            fill_w += fw if fw == fw else self.sc.cluster.fill_workers
            dec_w += dw if dw == dw else self.sc.cluster.decode_workers
        if passes:
            tpot = sum(passes) / len(passes)
        else:  # the streams' pass time, held through a sample in which none finished
            tpot = self.tpot_sum / self.tpot_n if self.tpot_n else self._last_tpot
        # slots: KV's, under the batch cap in force (the gate's, else the scenario's)
        cap = self.batch_cap if self.batch_cap == self.batch_cap else (self.sc.cluster.batch_cap or math.inf)
        slots_per_worker = min(self.kv_slots_per_worker, cap)
        self._last_tpot = tpot
        m = Measurement(time_s=stamp, backlog=float(len(self.backlog) + self.held), fill_in_progress=fill_q,
                        ready=ready, active_decodes=decoding, completion_rate=self.completed_since / T,
                        admitted_rate=self.admitted_since / T, decode_slots=dec_w * slots_per_worker,
                        fill_capacity=fill_w * self.fill_rps_per_worker, fill_workers=fill_w,
                        decode_workers=dec_w, arrival_rate=self.arrived_since / T, fill_queued_tokens=tokens,
                        decode_pass_s=tpot, decode_batch_cap=cap)
        self.arrived_since = self.admitted_since = self.completed_since = 0
        self.tpot_sum, self.tpot_n = 0.0, 0
        return m

    async def _control_loop(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            if self.ctrl is not None and any(u.healthy for u in self.upstreams):
                m = self.measurement()
                self.last_m = m
                acts = sort_actions(self.ctrl.update(self.now(), m))
                if acts.admission is not None:
                    self.action = acts.admission
                    self.tokens = min(self.tokens, max(1.0, self.action.rate * self.period))
                if acts.batch_cap is not None:
                    await self._apply_cap(acts.batch_cap)
            self.sample_event.set()
            self.sample_event = asyncio.Event()
            self._release()

    async def _apply_cap(self, cap: BatchCapAction) -> None:
        value = float(cap.batch_per_worker)
        if value == self.batch_cap:
            return
        self.batch_cap = value
        for u in self.upstreams:
            if not (u.healthy and u.accepts_cap):
                continue
            try:
                async with self.session.post(u.url + "/tokenfactory/batch_cap", json={"batch_cap": max(value, 1.0)},
                                             timeout=aiohttp.ClientTimeout(total=1.0)) as r:
                    u.accepts_cap = r.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                pass

    # -- the rate form (controllers without decide) ------------------------------------------
    def _take_token(self) -> bool:
        rate = self.action.rate
        if rate == math.inf:
            return True
        t = self.now()
        self.tokens = min(self.tokens + rate * (t - self.token_t), max(1.0, rate * self.period))
        self.token_t = t
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def _release(self) -> None:
        while self.backlog and self._take_token():
            fut = self.backlog.popleft()
            if not fut.done():
                fut.set_result(True)
        if self.backlog and self.action.rate > 0:
            need = (1.0 - self.tokens) / self.action.rate
            asyncio.get_running_loop().call_later(min(need, self.period), self._release)

    # -- a request ----------------------------------------------------------------------------
    def _reject(self, cls: str, reason: str, status: int = 429, retry_s: float = 1.0,
                arrived: float = math.nan, request_id: str | None = None, deferred: bool = False) -> web.Response:
        self._log(cls, "rejected", reason, arrived, request_id=request_id, deferred=deferred)
        self.c_rejected.inc(1.0, {"request_class": cls, "reason": reason})
        self.ended["rejected"] += 1
        self.deciding -= 1
        msg = {"object": "error", "type": "RateLimitError" if status == 429 else "ServiceUnavailableError",
               "message": f"rejected by the admission gateway: {reason}", "reason": reason, "code": status}
        return web.json_response(msg, status=status, headers={"Retry-After": str(max(1, math.ceil(retry_s))),
                                                              REASON_HEADER: reason})

    async def _decide(self, cls: str, arrival: Arrival) -> tuple[bool, str]:
        """Admit (True) or the rejection reason, waiting while deferred or queued."""
        if self.ctrl is None:
            return True, ""
        if self.gate is not None:
            deferred = False
            deadline = arrival.arrived_s + self.max_defer.get(cls, 0.0)
            while True:
                d = self.gate(self.now(), arrival)
                if d.verdict == "admit":
                    self.predicted_ttft = getattr(self.ctrl, "last_fill_wait", math.nan)
                    return True, ""
                if d.verdict == "defer" and self.now() < deadline:
                    if not deferred:
                        deferred = True
                        self._was_held.add(id(arrival))
                        self.c_deferred.inc(1.0, {"request_class": cls})
                    self.held += 1
                    try:
                        await asyncio.wait_for(self.sample_event.wait(), max(deadline - self.now(), 0.0))
                    except asyncio.TimeoutError:
                        pass
                    finally:
                        self.held -= 1
                    if self.now() >= deadline:
                        return False, "deferral_expired"
                    continue
                return False, d.reason if d.reason in REJECT_REASONS else "predicted_slo_violation"
        # a rate controller: queue within the bound, leave at the rate
        if not self.backlog and self._take_token():
            return True, ""
        if len(self.backlog) >= self.action.backlog_bound:
            return False, self.action.reason
        fut = asyncio.get_running_loop().create_future()
        self.backlog.append(fut)
        self._release()
        try:
            await fut
        finally:
            if not fut.done():
                fut.cancel()
        return True, ""

    def _pick(self) -> _Upstream | None:
        ups = [u for u in self.upstreams if u.healthy]
        return min(ups, key=lambda u: u.in_flight) if ups else None

    async def handle(self, request: web.Request, path: str, chat: bool) -> web.StreamResponse:
        raw = await request.read()
        cls = request.headers.get(CLASS_HEADER) or self.top
        if cls not in self.class_names:
            cls = self.top
        self.received += 1
        self.deciding += 1
        self.arrived_since += 1
        self.c_requests.inc(1.0, {"request_class": cls})
        try:
            body = json.loads(raw) if raw else {}
            if not isinstance(body, dict):
                raise ValueError
        except ValueError:
            self.ended["rejected"] += 1
            self.deciding -= 1
            self.c_rejected.inc(1.0, {"request_class": cls, "reason": "bad_request"})
            return web.json_response({"object": "error", "message": "the body must be a JSON object",
                                      "reason": "bad_request", "code": 400}, status=400)
        try:
            prompt, max_tokens = request_tokens(body, chat)
        except ConfigError as e:  # what the upstream would refuse: refused here, counted
            self.ended["rejected"] += 1
            self.deciding -= 1
            self.c_rejected.inc(1.0, {"request_class": cls, "reason": "bad_request"})
            return web.json_response({"object": "error", "message": str(e), "reason": "bad_request", "code": 400},
                                     status=400)
        rid = request.headers.get("x-request-id")
        if self._pick() is None:
            return self._reject(cls, "upstream_unavailable", 503, self.scrape_s, request_id=rid)
        arrival = Arrival(cls, prompt, 0, float(max_tokens or self.nominal_output), self.now())
        try:
            ok, reason = await self._decide(cls, arrival)
        except asyncio.CancelledError:  # the client left while held: a rejection it will not read
            self._was_held.discard(id(arrival))
            self._reject(cls, "deferral_expired", request_id=rid, deferred=True)
            raise
        deferred = id(arrival) in self._was_held
        self._was_held.discard(id(arrival))
        if not ok:
            retry = self.max_defer.get(cls, 0.0) if reason == "deferral_expired" else self.period
            return self._reject(cls, reason, 429, retry, arrival.arrived_s, rid, deferred)
        u = self._pick()
        if u is None:  # every upstream went down while it was held
            return self._reject(cls, "upstream_unavailable", 503, self.scrape_s, request_id=rid, deferred=deferred)
        self.c_admitted.inc(1.0, {"request_class": cls})
        self.admitted_since += 1
        return await self._proxy(request, u, path, raw, cls, prompt, bool(body.get("stream", False)),
                                 arrival.arrived_s, rid, deferred)

    async def _proxy(self, request, u: _Upstream, path: str, raw: bytes, cls: str, prompt: int,
                     stream: bool, arrived: float, request_id: str | None = None,
                     deferred: bool = False) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        u.in_flight += 1
        self.in_flight += 1
        self.deciding -= 1
        self.prefilling += 1
        self.prefill_tokens += prompt
        t_sent = self.now()
        first = second = math.nan
        events = 0
        second_at = 3 if path.endswith("chat/completions") else 2  # events up to the second token
        resp = None
        outcome = "failed_upstream"
        try:
            async with self.session.post(u.url + path, data=raw, headers=headers) as up:
                out_headers = {k: v for k, v in up.headers.items() if k.lower() not in _HOP}
                resp = web.StreamResponse(status=up.status, headers=out_headers)
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    if first != first:
                        first = self.now()
                        self.prefilling -= 1
                        self.prefill_tokens -= prompt
                        self.decoding += 1
                    events += chunk.count(b"data: ") if stream else 0
                    if second != second and events >= second_at:
                        second = self.now()
                    await resp.write(chunk)
                await resp.write_eof()
                outcome = "completed" if up.status < 400 else "failed_upstream"
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            u.failures += 1
            if resp is None:
                resp = web.json_response({"object": "error", "message": f"upstream {u.url} failed: {e}",
                                          "reason": "failed_upstream", "code": 502}, status=502)
        finally:
            u.in_flight -= 1
            self.in_flight -= 1
            if first != first:
                self.prefilling -= 1
                self.prefill_tokens -= prompt
            else:
                self.decoding -= 1
            self.ended[outcome] += 1
            (self.c_completed if outcome == "completed" else self.c_failed).inc(1.0, {"request_class": cls})
            self._log(cls, outcome, "", arrived, t_sent, first, prompt, events, request_id, deferred)
            if outcome == "completed":
                self.completed_since += 1
                tokens = events - 1 - (path.endswith("chat/completions"))  # [DONE] and chat's role chunk
                if second == second and tokens > 2:  # passes after the slot wait (module notes)
                    self.tpot_sum += (self.now() - second) / (tokens - 2)
                    self.tpot_n += 1
        return resp


#: where a gateway application keeps its :class:`Gateway` (``app[GATEWAY_KEY]``)
GATEWAY_KEY = web.AppKey("gateway", Gateway)


def gateway_app(scenario: LiveScenario, upstreams: list[str], **kw) -> web.Application:
    """The aiohttp application of a gateway (its loops start and stop with the application).

    Parameters
    ----------
    scenario : LiveScenario
        The scenario.
    upstreams : list of str
        Engine base URLs.
    **kw
        :class:`Gateway` options (``controller``, ``open_gate``).
    """
    app = web.Application()
    holder: dict = {}

    async def on_startup(app):
        gw = Gateway(scenario, upstreams, **kw)
        holder["gw"] = gw
        app[GATEWAY_KEY] = gw
        await gw.start()

    async def on_cleanup(app):
        await holder["gw"].stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)

    async def completions(request):
        return await holder["gw"].handle(request, "/v1/completions", False)

    async def chat(request):
        return await holder["gw"].handle(request, "/v1/chat/completions", True)

    async def metrics(request):
        return web.Response(text=holder["gw"].metrics.render(), content_type="text/plain", charset="utf-8")

    async def health(request):
        ok = any(u.healthy for u in holder["gw"].upstreams)
        return web.Response(text="" if ok else "no healthy upstream", status=200 if ok else 503)

    async def models(request):
        gw = holder["gw"]
        u = gw._pick()
        if u is None:
            return web.json_response({"object": "error", "message": "no healthy upstream"}, status=503)
        async with gw.session.get(u.url + "/v1/models") as r:
            return web.Response(body=await r.read(), status=r.status, content_type="application/json")

    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    return app
