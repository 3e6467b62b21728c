"""The engine emulator: an OpenAI-compatible server whose timing is the request simulator's.

``tokenfactory emulate --scenario FILE --port P`` serves

* ``POST /v1/completions`` and ``POST /v1/chat/completions``: streaming (server-sent events, one
  event per token as the engine emits it, ``data: [DONE]`` last; ``stream_options.include_usage``
  adds the usage chunk) or not (one JSON body when the request completes); ``usage`` carries
  prompt, completion and total tokens;
* ``GET /v1/models``, ``GET /health`` and ``GET /metrics`` (Prometheus text, vLLM's names and
  types: :data:`VLLM_METRICS`).

Timing is :class:`tokenfactory.live.engine.RealtimeEngine` - the request simulator on the wall
clock - so one scenario file runs the same in ``simulate`` and on the wire.

Request length. The prompt is ``prompt_token_ids`` (or a ``prompt`` given as a list of token ids)
when the request carries token ids; otherwise its length is estimated as ceil(characters / 4),
OpenAI's rule of thumb for English text ("a token is about 4 characters", OpenAI's tokenizer
help page). The output is ``max_tokens`` (``max_completion_tokens`` for chat) tokens - the
emulator never stops early, as a benchmark run with ``ignore_eos`` - or the scenario's nominal
output when the request gives none. Token ids hash into prefix-cache blocks
(:func:`tokenfactory.live.engine.block_hashes`); text prompts hash by characters (4 per token).

Metrics delay. A real server's metrics are read through a scrape; the emulator publishes its
state ``metrics_delay_s`` late (a queue of timestamped updates, gauges sampled every 10 ms), so
the delay a controller sees is a known parameter of the scenario that ``identify`` can recover.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections import deque

from aiohttp import web

from tokenfactory.core.errors import ConfigError
from tokenfactory.live.engine import EngineFull, RealtimeEngine, block_hashes
from tokenfactory.live.exposition import Registry
from tokenfactory.live.live_scenario import CLASS_HEADER, LiveScenario
from tokenfactory.plant_models.des.records import Stage

__all__ = ["Emulator", "EMULATOR_KEY", "request_tokens", "VLLM_METRICS", "TTFT_BUCKETS", "TPOT_BUCKETS", "LATENCY_BUCKETS", "estimate_tokens",
           "emulator_app"]

# Buckets as vLLM's Prometheus logger defines them (vllm/v1/metrics/loggers.py, PrometheusStatLogger)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)
#: the vLLM metrics the emulator serves: name -> type (labels model_name and engine, as vLLM's)
VLLM_METRICS = {
    "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge", "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prompt_tokens": "counter", "vllm:generation_tokens": "counter", "vllm:request_success": "counter",
    "vllm:num_preemptions": "counter", "vllm:prefix_cache_queries": "counter", "vllm:prefix_cache_hits": "counter",
    "vllm:time_to_first_token_seconds": "histogram", "vllm:inter_token_latency_seconds": "histogram",
    "vllm:time_per_output_token_seconds": "histogram", "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram", "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram", "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
}
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
_GAUGE_PERIOD_S = 0.01
_CHARS_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    """Tokens of a text prompt: ceil(characters / 4), at least 1 (module notes).

    Parameters
    ----------
    text : str
        The prompt.

    Returns
    -------
    int
    """
    return max(1, math.ceil(len(text) / _CHARS_PER_TOKEN))


def _text_ids(text: str) -> list[int]:
    """Pseudo token ids of a text (4 characters each) so equal prefixes share cache blocks."""
    return [hash(text[k:k + _CHARS_PER_TOKEN]) for k in range(0, len(text), _CHARS_PER_TOKEN)] or [0]


class _Open:
    """A request the server waits on: how many tokens it has sent, and a wake-up."""

    __slots__ = ("index", "event", "emitted", "done", "reason")

    def __init__(self, index: int, reason: str):
        self.index, self.event, self.emitted, self.done, self.reason = index, asyncio.Event(), 0, False, reason


class Emulator:
    """The engine emulator's state: the real-time engine, the open requests and the metrics.

    Parameters
    ----------
    scenario : LiveScenario
        The scenario (service model, cluster, ``[live]`` section).
    request_log : str, optional
        A file to append one JSON line per finished request to (:meth:`log_request`): the engine's
        times of its arrival, first token and completion and the wall-clock times it was received
        and its first token written, in unix seconds - what separates the service model's time
        from the server's (HTTP, the clock loop's tick and lag) when a run is taken apart.
    """

    def __init__(self, scenario: LiveScenario, request_log: str | None = None):
        self.sc = scenario
        self.log = open(request_log, "a", buffering=1 << 16) if request_log else None
        live = scenario.live
        self.model_name = live["model_name"]
        self.engine = RealtimeEngine(scenario.setup.params, scenario.cluster, nominal_input=live["prompt_tokens"],
                                     nominal_output=live["output_tokens"], capacity=live["capacity"])
        self.tick_s = float(live["tick_s"])
        self.delay_s = scenario.metrics_delay_s
        self.open: dict[int, _Open] = {}
        self.pending: deque = deque()      # (publish time, fn, args): metric updates not yet visible
        self.wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._last_gauge = -math.inf
        self._preempt_seen = 0
        self._hits_seen = self._lookups_seen = 0
        L = ("model_name", "engine")
        self.labels = {"model_name": self.model_name, "engine": "0"}
        r = self.registry = Registry()
        self.g_running = r.gauge("vllm:num_requests_running", "Number of requests in model execution batches.", L)
        self.g_waiting = r.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", L)
        self.g_kv = r.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", L)
        self.c_prompt = r.counter("vllm:prompt_tokens", "Number of prefill tokens processed.", L)
        self.c_gen = r.counter("vllm:generation_tokens", "Number of generation tokens processed.", L)
        self.c_success = r.counter("vllm:request_success", "Count of successfully processed requests.",
                                   (*L, "finished_reason"))
        self.c_preempt = r.counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", L)
        self.c_pc_q = r.counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried "
                                "tokens.", L)
        self.c_pc_h = r.counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", L)
        self.h_ttft = r.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                                  TTFT_BUCKETS, L)
        self.h_itl = r.histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                                 TPOT_BUCKETS, L)
        self.h_tpot = r.histogram("vllm:time_per_output_token_seconds", "Histogram of time per output token in "
                                  "seconds.", TPOT_BUCKETS, L)
        self.h_e2e = r.histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                                 LATENCY_BUCKETS, L)
        self.h_queue = r.histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for "
                                   "request.", LATENCY_BUCKETS, L)
        self.h_prefill = r.histogram("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase "
                                     "for request.", LATENCY_BUCKETS, L)
        self.h_decode = r.histogram("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for "
                                    "request.", LATENCY_BUCKETS, L)
        self.h_prompt = r.histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                    _TOKEN_BUCKETS, L)
        self.h_gen = r.histogram("vllm:request_generation_tokens", "Number of generation tokens processed.",
                                 _TOKEN_BUCKETS, L)
        # the emulator's own figures (pools as the scenario has them; what identify is checked against)
        PL = ("model_name", "pool")
        self.g_workers = r.gauge("tokenfactory:emulator_workers", "Serving workers by pool.", PL)
        self.g_fill_tokens = r.gauge("tokenfactory:emulator_fill_queued_tokens", "Prompt tokens admitted and not "
                                     "yet prefilled (the request simulator's measurement).", ("model_name",))
        self.g_pass = r.gauge("tokenfactory:emulator_decode_pass_seconds", "Mean pass time of the busy decode "
                              "workers now (s; NaN when none decodes; the request simulator's measurement).",
                              ("model_name",))
        self.g_stage = r.gauge("tokenfactory:emulator_requests", "Requests by stage (fill_queue, prefilling, "
                               "transfer, ready, decoding).", ("model_name", "stage"))
        # how late the clock loop wakes (a starved process falls behind the wall clock: its timing
        # then lags the simulator's by this much)
        self.h_lag = r.histogram("tokenfactory:emulator_loop_lag_seconds", "Lateness of the clock loop's wake-ups "
                                 "(s).", (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0), ("model_name",))
        for pool, ws in (("fill", self.engine.fill_workers), ("decode", self.engine.decode_workers)):
            self.g_workers.set(len(ws), {"model_name": self.model_name, "pool": pool})
        for g in (self.g_running, self.g_waiting, self.g_kv):
            g.set(0.0, self.labels)
        self.requests_total = self.completed_total = 0
        self.max_lag_s = 0.0
        # the engine's clock (monotonic since its start) in unix seconds
        self.unix0 = time.time() - self.engine.now()

    def log_request(self, o: "_Open", request_id: str | None, received_unix_s: float, first_write_unix_s: float,
                    tokens_written: int) -> None:
        """Append request ``o``'s line to the request log (class notes; nothing without a log)."""
        if self.log is None:
            return
        t = self.engine.times(o.index)
        u = self.unix0
        self.log.write(json.dumps({
            "request_id": request_id, "received_unix_s": received_unix_s, "arrival_unix_s": u + t.arrival_s,
            "first_token_unix_s": u + t.first_token_s, "completion_unix_s": u + t.completion_s,
            "first_write_unix_s": first_write_unix_s, "end_unix_s": time.time(), "input_tokens": t.input_tokens,
            "output_tokens": t.output_tokens, "tokens_written": tokens_written, "done": o.done}) + "\n")

    # -- the clock loop ----------------------------------------------------------------------
    def start(self) -> None:
        """Start the clock loop (on the running event loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop the clock loop."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self.log is not None:
            self.log.close()
            self.log = None

    async def _run(self) -> None:
        eng = self.engine
        while True:
            now = eng.advance()
            self._notify(now)
            self._publish(now)
            if self.open:
                t_ask = eng.now()
                await asyncio.sleep(self.tick_s)
                lag = max(eng.now() - t_ask - self.tick_s, 0.0)
                self.max_lag_s = max(self.max_lag_s, lag)
                self.h_lag.observe(lag, {"model_name": self.model_name})
            else:
                self.wake.clear()
                timeout = min(max(eng.next_event_s() - eng.now(), 0.0), _GAUGE_PERIOD_S)
                try:
                    await asyncio.wait_for(self.wake.wait(), timeout)
                except asyncio.TimeoutError:
                    pass

    def _notify(self, now: float) -> None:
        eng = self.engine
        if not self.open:
            return
        pos = eng.decode_positions()
        finished = []
        for i, o in self.open.items():
            n = eng.emitted(i, pos)
            if n > o.emitted:
                self._later(now, self.c_gen.inc, n - o.emitted, self.labels)
                o.emitted = n
                o.event.set()
            if eng.rec.stage[i] == Stage.COMPLETED:
                o.done = True
                o.event.set()
                finished.append(i)
        for i in finished:
            o = self.open.pop(i)
            self._completed(i, o)

    def _completed(self, i: int, o: _Open) -> None:
        t = self.engine.times(i)
        L = self.labels
        ttft = t.first_token_s - t.arrival_s
        e2e = t.completion_s - t.arrival_s
        now = t.completion_s
        self.completed_total += 1
        self._later(now, self.h_ttft.observe, ttft, L)
        self._later(now, self.h_e2e.observe, e2e, L)
        self._later(now, self.h_queue.observe, max(t.fill_start_s - t.arrival_s, 0.0), L)
        self._later(now, self.h_prefill.observe, max(t.first_token_s - t.fill_start_s, 0.0), L)
        self._later(now, self.h_decode.observe, max(t.completion_s - t.first_token_s, 0.0), L)
        self._later(now, self.h_gen.observe, t.output_tokens, L)
        if t.output_tokens > 1:
            tpot = (t.completion_s - t.first_token_s) / (t.output_tokens - 1)
            self._later(now, self.h_tpot.observe, tpot, L)
            # the leap model times each request's passes, not each token's gap: its gaps are
            # observed at their mean (one observation per gap, as vLLM counts them)
            self._later(now, self.h_itl.observe, tpot, L, t.output_tokens - 1)
        self._later(now, self.c_success.inc, 1.0, {**L, "finished_reason": o.reason})

    def _later(self, t: float, fn, *args) -> None:
        self.pending.append((t + self.delay_s, fn, args))

    def _publish(self, now: float) -> None:
        eng = self.engine
        if now - self._last_gauge >= _GAUGE_PERIOD_S:
            self._last_gauge = now
            c = eng.counts()
            L = self.labels
            self._later(now, self.g_running.set, c["decoding"] + c["prefilling"], L)
            self._later(now, self.g_waiting.set, c["fill_queue"] + c["backlog"] + c["transfer"] + c["ready"], L)
            self._later(now, self.g_kv.set, eng.kv_usage(), L)
            ML = {"model_name": self.model_name}
            self._later(now, self.g_fill_tokens.set, eng.fill_queued_tokens(), ML)
            self._later(now, self.g_pass.set, eng.decode_pass_now(), ML)
            for st in ("fill_queue", "prefilling", "transfer", "ready", "decoding"):
                self._later(now, self.g_stage.set, c[st], {"model_name": self.model_name, "stage": st})
            pre = int(eng.rec.preemptions[:eng.used].sum()) if eng.used else 0
            if pre > self._preempt_seen:
                self._later(now, self.c_preempt.inc, pre - self._preempt_seen, L)
                self._preempt_seen = pre
            if eng.lookup_tokens > self._lookups_seen:
                self._later(now, self.c_pc_q.inc, eng.lookup_tokens - self._lookups_seen, L)
                self._later(now, self.c_pc_h.inc, eng.hit_tokens - self._hits_seen, L)
                self._lookups_seen, self._hits_seen = eng.lookup_tokens, eng.hit_tokens
        q = self.pending
        while q and q[0][0] <= now:
            _, fn, args = q.popleft()
            fn(*args)

    # -- requests ----------------------------------------------------------------------------
    def submit(self, prompt_ids: list[int] | None, prompt_text: str | None, max_tokens: int | None,
               request_class: str | None) -> _Open:
        """Put a request into the engine now; the returned handle is woken as tokens come."""
        eng = self.engine
        n_in = len(prompt_ids) if prompt_ids is not None else estimate_tokens(prompt_text or "")
        out = int(max_tokens) if max_tokens is not None else int(self.sc.live["output_tokens"])
        blocks = None
        if eng.cfg.prefix_cache_blocks is not None:  # hash the prompt only when a cache looks at it
            ids = prompt_ids if prompt_ids is not None else _text_ids(prompt_text or "")
            blocks = block_hashes(ids, eng.p.block_tokens)
        classes = eng.class_names
        cls = request_class if request_class in classes else None
        i = eng.submit(n_in, out, blocks=blocks, request_class=cls)
        self.requests_total += 1
        self._later(eng.env.now, self.c_prompt.inc, n_in, self.labels)
        self._later(eng.env.now, self.h_prompt.observe, n_in, self.labels)
        o = _Open(i, "length" if max_tokens is not None else "stop")
        self.open[i] = o
        self.wake.set()
        return o


def _bad(msg: str, status: int = 400) -> web.Response:
    return web.json_response({"object": "error", "message": msg, "type": "BadRequestError", "code": status},
                             status=status)


def _int_field(body: dict, key: str, low: int = 1) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ConfigError(key, f"expected an integer >= {low}, got {v!r}")
    return v


def _prompt_of(body: dict, chat: bool) -> tuple[list[int] | None, str | None]:
    ids = body.get("prompt_token_ids")
    if ids is not None:
        if not isinstance(ids, list) or not ids or not all(isinstance(x, int) for x in ids):
            raise ConfigError("prompt_token_ids", "expected a non-empty list of integers")
        return ids, None
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise ConfigError("messages", "expected a non-empty list of messages")
        parts = []
        for m in msgs:
            c = m.get("content", "") if isinstance(m, dict) else ""
            if isinstance(c, list):  # content parts: keep the text ones
                c = "".join(p.get("text", "") for p in c if isinstance(p, dict))
            parts.append(f"{m.get('role', '') if isinstance(m, dict) else ''}: {c}\n")
        return None, "".join(parts)
    p = body.get("prompt")
    if isinstance(p, list) and p and all(isinstance(x, int) for x in p):
        return p, None
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
        p = p[0]
    if not isinstance(p, str):
        raise ConfigError("prompt", "expected a string or a list of token ids (one prompt per request)")
    return None, p


#: where an emulator application keeps its :class:`Emulator` (``app[EMULATOR_KEY]``)
EMULATOR_KEY = web.AppKey("emulator", Emulator)


def request_tokens(body: dict, chat: bool) -> tuple[int, int | None]:
    """A request body's prompt tokens and ``max_tokens`` by the emulator's rules (token ids when
    given, else characters / 4); the gateway predicts with the same figure the emulator serves.

    Parameters
    ----------
    body : dict
        The parsed JSON body.
    chat : bool
        A chat completion (``messages``, ``max_completion_tokens``).

    Returns
    -------
    tuple
        ``(prompt tokens, max tokens or None)``.

    Raises
    ------
    ConfigError
        For a malformed prompt or ``max_tokens``, naming the field.
    """
    ids, text = _prompt_of(body, chat)
    n = len(ids) if ids is not None else estimate_tokens(text or "")
    return n, _int_field(body, "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens")


def emulator_app(scenario: LiveScenario, request_log: str | None = None) -> web.Application:
    """The aiohttp application of an emulator for ``scenario`` (its clock loop starts and stops
    with the application).

    Parameters
    ----------
    scenario : LiveScenario
        The scenario.
    request_log : str, optional
        :class:`Emulator`'s per-request log file.

    Returns
    -------
    aiohttp.web.Application
    """
    app = web.Application()

    async def on_startup(app):
        em = Emulator(scenario, request_log)
        app[EMULATOR_KEY] = em
        em.start()

    async def on_cleanup(app):
        await app[EMULATOR_KEY].stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_post("/tokenfactory/batch_cap", _batch_cap)
    app.router.add_post("/v1/completions", _completions_route)
    app.router.add_post("/v1/chat/completions", _chat_route)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    return app


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="")


async def _models(request: web.Request) -> web.Response:
    em = request.app[EMULATOR_KEY]
    return web.json_response({"object": "list", "data": [{"id": em.model_name, "object": "model",
                                                           "created": 0, "owned_by": "tokenfactory",
                                                           "max_model_len": None}]})


async def _metrics(request: web.Request) -> web.Response:
    """The Prometheus text of the metrics published so far (the engine advanced to now first)."""
    em = request.app[EMULATOR_KEY]
    em._publish(em.engine.advance())
    return web.Response(text=em.registry.render(), content_type="text/plain", charset="utf-8",
                        headers={"X-Content-Type-Options": "nosniff"})


async def _batch_cap(request: web.Request) -> web.Response:
    # the gateway's batch gate actuates here (a vLLM server has no such endpoint: there the
    # gate's cap is reported, not applied)
    em = request.app[EMULATOR_KEY]
    try:
        cap = float((await request.json())["batch_cap"])
        if not cap >= 1:
            raise ValueError
    except (KeyError, ValueError, TypeError, json.JSONDecodeError):
        return _bad("expected {\"batch_cap\": number >= 1}")
    em.engine.advance()
    em.engine.set_batch_cap(cap)
    return web.json_response({"batch_cap": em.engine.batch_cap})


async def _completions_route(request: web.Request) -> web.StreamResponse:
    return await _completions(request, False)


async def _chat_route(request: web.Request) -> web.StreamResponse:
    return await _completions(request, True)


def _completion_request(body: dict, chat: bool) -> tuple[list[int] | None, str | None, int | None]:
    """The prompt (token ids or text) and ``max_tokens`` of a completion request body."""
    ids, text = _prompt_of(body, chat)
    max_tokens = _int_field(body, "max_completion_tokens" if chat and "max_completion_tokens" in body
                            else "max_tokens")
    if body.get("n", 1) != 1:
        raise ConfigError("n", "the emulator serves one choice per request")
    return ids, text, max_tokens


async def _completions(request: web.Request, chat: bool) -> web.StreamResponse:
    """``POST /v1/completions`` (``chat`` False) or ``/v1/chat/completions``: submit the request to the
    engine and answer when it completes, or stream its tokens as the engine emits them."""
    em = request.app[EMULATOR_KEY]
    received = time.time()
    request_id = request.headers.get("x-request-id")
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _bad("the body is not JSON")
    if not isinstance(body, dict):
        return _bad("the body must be a JSON object")
    try:
        ids, text, max_tokens = _completion_request(body, chat)
    except ConfigError as e:
        return _bad(str(e))
    stream = bool(body.get("stream", False))
    include_usage = bool((body.get("stream_options") or {}).get("include_usage", False))
    try:
        o = em.submit(ids, text, max_tokens, request.headers.get(CLASS_HEADER))
    except EngineFull as e:
        return _bad(str(e), 503)
    reply = _Reply(em, o, chat)
    if not stream:
        while not o.done:
            await o.event.wait()
            o.event.clear()
        em.log_request(o, request_id, received, math.nan, 0)
        return web.json_response(reply.whole())
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    sent = 0
    first_write = math.nan
    try:
        first = True
        while True:
            await o.event.wait()
            o.event.clear()
            new = o.emitted - sent
            buf = []
            if chat and first and new > 0:
                buf.append(reply.event(None, None, first=True))
                first = False
            for k in range(new):
                last = o.done and sent + k + 1 == reply.n_out
                buf.append(reply.event(" tok", o.reason if last else None))
            sent += new
            if buf:
                if first_write != first_write:
                    first_write = time.time()
                await resp.write(b"".join(buf))
            if o.done and sent >= reply.n_out:
                break
        if include_usage:
            await resp.write(reply.usage_event())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
    except (ConnectionResetError, asyncio.CancelledError):
        pass  # the client left: the engine finishes the request (its metrics still count it)
        raise
    finally:
        em.log_request(o, request_id, received, first_write, sent)
    return resp


class _Reply:
    """The OpenAI-format answer to one submitted request: the whole body, or its server-sent events."""

    def __init__(self, em: Emulator, o: _Open, chat: bool):
        self.o, self.chat, self.model = o, chat, em.model_name
        self.rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        n_in = em.engine.inp[o.index]
        self.n_out = em.engine.out[o.index]
        self.usage = {"prompt_tokens": n_in, "completion_tokens": self.n_out, "total_tokens": n_in + self.n_out}
        self.chunk_obj = "chat.completion.chunk" if chat else "text_completion"

    def whole(self) -> dict:
        """The non-streaming body: every token at once, with the usage."""
        text_out = "".join(" tok" for _ in range(self.n_out))
        choice = ({"index": 0, "message": {"role": "assistant", "content": text_out}, "finish_reason": self.o.reason}
                  if self.chat else {"index": 0, "text": text_out, "logprobs": None, "finish_reason": self.o.reason})
        return {"id": self.rid, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice], "usage": self.usage}

    def event(self, delta: str | None, finish: str | None, first: bool = False) -> bytes:
        """One token's server-sent event (``first``: a chat stream's opening role event)."""
        if self.chat:
            d = {"role": "assistant", "content": ""} if first else ({"content": delta} if delta else {})
            choice = {"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
        return self._sse({"id": self.rid, "object": self.chunk_obj, "created": self.created, "model": self.model,
                          "choices": [choice]})

    def usage_event(self) -> bytes:
        """The usage chunk (``stream_options.include_usage``)."""
        return self._sse({"id": self.rid, "object": self.chunk_obj, "created": self.created, "model": self.model,
                          "choices": [], "usage": self.usage})

    @staticmethod
    def _sse(msg: dict) -> bytes:
        return b"data: " + json.dumps(msg, separators=(",", ":")).encode() + b"\n\n"
