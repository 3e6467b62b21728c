"""The admission gateway over real HTTP in front of the emulator: streams pass through, the
registry's controller decides, rejections carry a reason, every request is accounted for."""

import asyncio
import json
import math
import time

import aiohttp
import numpy as np
import pandas as pd
import pytest

from tokenfactory.live.exposition import parse_text, sample_value
from tokenfactory.live.gateway import GATEWAY_KEY, REASON_HEADER, Gateway, gateway_app
from tokenfactory.live.prometheus_server import free_port
from tokenfactory.live.live_scenario import load_live_scenario
from tokenfactory.core.signals import AdmissionAction, Decision
from tokenfactory.controllers.slo_admission import SLOAwareAdmission

from live_servers import LoopLag, emulator_and_gateway, serving


@pytest.fixture(scope="module")
def sc():
    return load_live_scenario("live_small")


async def _tokens(s, url, body, headers=None):
    n = 0
    async with s.post(url, json=body, headers=headers or {}) as r:
        if r.status != 200:
            return r.status, dict(r.headers), await r.json()
        async for line in r.content:
            n += line.startswith(b"data: {")
    return 200, {}, n


def test_streams_pass_through_and_overload_is_shed(sc):
    async def main():
        async with emulator_and_gateway(sc) as (eu, gu, em, gw):
            assert isinstance(gw.ctrl, SLOAwareAdmission)  # the scenario's kind, built by the registry
            async with aiohttp.ClientSession() as s:
                body = {"prompt_token_ids": list(range(1000)), "max_tokens": 12, "stream": True}
                assert await _tokens(s, gu + "/v1/completions", body) == (200, {}, 12)
                # a burst far above what decode serves within the TPOT SLO
                burst = await asyncio.gather(*(_tokens(s, gu + "/v1/completions", {**body, "max_tokens": 32})
                                               for _ in range(120)))
                async with s.get(gu + "/metrics") as r:
                    text = await r.text()
                return burst, gw.accounting(), text, em.engine.arrived

    burst, acc, text, engine_arrived = asyncio.run(main())
    ok = [b for b in burst if b[0] == 200]
    rejected = [b for b in burst if b[0] == 429]
    assert ok and rejected and len(ok) + len(rejected) == 120
    assert all(b[2] == 32 for b in ok)
    assert all(int(b[1]["Retry-After"]) >= 1 and b[1][REASON_HEADER] == b[2]["reason"] for b in rejected)
    assert acc["balanced"] and acc["received"] == 121 and acc["completed"] == len(ok) + 1
    assert acc["rejected"] == len(rejected) and acc["in_flight"] == 0
    assert engine_arrived == len(ok) + 1  # a rejected request never reaches the engine
    s = parse_text(text)
    assert sample_value(s, "tokenfactory:gateway_rejected_total") == len(rejected)
    assert sample_value(s, "tokenfactory:gateway_admitted_total") == len(ok) + 1
    assert sample_value(s, "tokenfactory:gateway_completed_total") == len(ok) + 1


def test_fails_closed_when_the_upstream_is_down(sc):
    async def main():
        dead = f"http://127.0.0.1:{free_port()}"
        async with serving(gateway_app(sc, [dead])) as (gu, app):
            async with aiohttp.ClientSession() as s:
                async with s.post(gu + "/v1/completions", json={"prompt": "hi", "max_tokens": 3}) as r:
                    status, reason = r.status, r.headers.get(REASON_HEADER)
                async with s.get(gu + "/health") as r:
                    health = r.status
                async with s.post(gu + "/v1/completions", json={"prompt": "hi", "max_tokens": -2}) as r:
                    bad = (r.status, (await r.json())["reason"])
            return status, reason, health, bad, app[GATEWAY_KEY].accounting()

    status, reason, health, bad, acc = asyncio.run(main())
    assert (status, reason, health) == (503, "upstream_unavailable", 503)
    assert bad == (400, "bad_request")  # named before any upstream is asked
    assert acc["balanced"] and acc["rejected"] == 2


class _Scripted:
    """A controller that defers every request (decide) or commands a rate (update)."""

    def __init__(self, gate: bool, rate: float = 2.0, bound: float = 1.0):
        self.sample_period = 0.1
        self.rate, self.bound = rate, bound
        if gate:
            self.decide = lambda t, a: Decision("defer", "decode_overloaded")

    def reset(self):
        pass

    def update(self, t, m):
        return AdmissionAction(self.rate, self.bound)


def test_deferral_ends_at_the_class_deadline(sc, tmp_path):
    async def main():
        async with emulator_and_gateway(sc, controller=_Scripted(gate=True),
                                        request_log=str(tmp_path / "g.jsonl")) as (eu, gu, em, gw):
            gw.max_defer[gw.top] = 0.4
            async with aiohttp.ClientSession() as s, LoopLag() as lag:
                t0 = asyncio.get_running_loop().time()
                async with s.post(gu + "/v1/completions", json={"prompt": "hi", "max_tokens": 3}) as r:
                    out = (r.status, r.headers[REASON_HEADER], asyncio.get_running_loop().time() - t0)
            return out, gw.accounting(), sample_value(parse_text(gw.metrics.render()),
                                                      "tokenfactory:gateway_deferred_total"), lag.total_s

    (status, reason, waited), acc, deferred, late_s = asyncio.run(main())
    assert (status, reason) == (429, "deferral_expired")
    # held to the 0.4 s deadline (never less: the client's clock starts before the gateway's), then
    # rejected within a sample or so - plus what a loaded machine added: the loop's measured lateness
    assert 0.4 <= waited <= 1.0 + late_s, (waited, late_s)
    assert deferred == 1 and acc["balanced"]
    (line,) = [json.loads(x) for x in (tmp_path / "g.jsonl").read_text().splitlines()]
    assert (line["status"], line["reason"], line["deferred"]) == ("rejected", "deferral_expired", True)


def test_a_rate_controller_queues_within_its_bound(sc, tmp_path):
    log = tmp_path / "requests.jsonl"

    async def main():
        async with emulator_and_gateway(sc, controller=_Scripted(gate=False, rate=4.0, bound=2.0),
                                        request_log=str(log)) as (eu, gu, em, gw):
            # one sample: the commanded rate is in force (waited for, not slept: a loaded loop is late)
            await asyncio.wait_for(gw.sample_event.wait(), 30.0)
            assert gw.action.rate == 4.0
            async with aiohttp.ClientSession() as s:
                res = await asyncio.gather(*(_tokens(s, gu + "/v1/completions", {"prompt": "hi", "max_tokens": 2,
                                                                                  "stream": True}) for _ in range(8)))
            return res, gw.accounting()

    res, acc = asyncio.run(main())
    codes = sorted(r[0] for r in res)
    assert codes.count(200) >= 2 and codes.count(429) >= 1
    assert all(r[2]["reason"] == "backlog_over_bound" for r in res if r[0] == 429)
    assert acc["balanced"] and acc["completed"] + acc["rejected"] == 8
    # the token bucket's own bound: over the arrivals' spread W (the gateway's clock, from its log)
    # at most one stored token plus rate x W leave, and the bound's 2 wait; the rest are rejected.
    # W is a few ms on a quiet machine (5 or 6 rejections); a loaded one spreads the burst.
    arrived = pd.read_json(log, lines=True)["arrived_unix_s"]
    spread_s = float(arrived.max() - arrived.min())
    assert codes.count(429) >= 8 - 1 - 2 - 4.0 * spread_s, (codes, spread_s)


def test_request_logs_of_gateway_and_emulator_join_by_request_id(sc, tmp_path):
    gw_log, em_log = tmp_path / "gateway.jsonl", tmp_path / "emulator.jsonl"

    async def main():
        async with emulator_and_gateway(sc, emulator_log=str(em_log), request_log=str(gw_log)) as (eu, gu, em, gw):
            async with aiohttp.ClientSession() as s:
                body = {"prompt_token_ids": list(range(500)), "max_tokens": 5, "stream": True}
                res = await asyncio.gather(*(_tokens(s, gu + "/v1/completions", body, {"x-request-id": f"r{k}"})
                                             for k in range(3)))
            # each maps its monotonic clock to unix once (unix0 = time.time() - now()); a process
            # preempted between those two reads is off by that long: measured here, as the median
            # of many reads, against time.time()
            skew = [np.median([x.unix0 + now() - time.time() for _ in range(51)])
                    for x, now in ((gw, gw.now), (em, em.engine.now))]
            return res, em.engine.times(0), skew

    res, times, (gw_skew, em_skew) = asyncio.run(main())
    assert [r[0] for r in res] == [200] * 3
    g = {r["request_id"]: r for r in map(json.loads, gw_log.read_text().splitlines())}
    e = {r["request_id"]: r for r in map(json.loads, em_log.read_text().splitlines())}
    assert set(g) == set(e) == {"r0", "r1", "r2"}
    for rid in g:
        gr, er = g[rid], e[rid]
        assert gr["status"] == "completed" and gr["deferred"] is False and er["tokens_written"] == 5
        # each hop after the one before it (unix stamps of one machine; monotonic clocks
        # mapped once to unix by each process, hence the 1 ms allowances plus each mapping's
        # measured skew where a mapped stamp meets a raw time.time() one)
        g_tol, e_tol = 1e-3 + abs(gw_skew), 1e-3 + abs(em_skew)
        assert gr["arrived_unix_s"] <= gr["sent_unix_s"] <= er["received_unix_s"] + g_tol
        assert er["received_unix_s"] <= er["arrival_unix_s"] + e_tol
        assert er["arrival_unix_s"] <= er["first_token_unix_s"] <= er["first_write_unix_s"] + e_tol
        assert er["first_write_unix_s"] <= gr["first_token_unix_s"] + g_tol
        assert er["first_token_unix_s"] - er["arrival_unix_s"] > 0
    assert times.first_token_s > times.arrival_s  # the log's engine times are the engine's records


def test_measurement_is_the_simulators_when_the_upstream_publishes_it(sc):
    gw = Gateway(sc, ["http://127.0.0.1:9"])  # no I/O until started
    u = gw.upstreams[0]
    u.healthy, u.scraped_s = True, gw.now()
    L = 'model_name="m"'
    emulator = "\n".join([*(f'tokenfactory:emulator_requests{{{L},stage="{k}"}} {v}' for k, v in (
        ("fill_queue", 2), ("prefilling", 1), ("transfer", 1), ("ready", 0), ("decoding", 20))),
        f"tokenfactory:emulator_fill_queued_tokens{{{L}}} 9500", f"tokenfactory:emulator_decode_pass_seconds{{{L}}} "
        "0.061"]) + "\n"
    u.samples = parse_text(emulator)
    gw.tpot_sum, gw.tpot_n = 0.5, 2  # the streams' figure is not used when the upstream publishes its own
    m = gw.measurement()
    assert (m.fill_queued_tokens, m.decode_pass_s, m.active_decodes) == (9500.0, 0.061, 20.0)
    # a vLLM upstream: the waiting requests' prompts, the streams' pass time, held through an empty sample
    u.samples = parse_text("vllm:num_requests_running 12\nvllm:num_requests_waiting 3\n")
    gw.tpot_sum, gw.tpot_n = 0.14, 2
    m = gw.measurement()
    assert m.fill_queued_tokens == 3 * sc.live["prompt_tokens"] and m.decode_pass_s == pytest.approx(0.07)
    assert gw.measurement().decode_pass_s == pytest.approx(0.07)  # no stream finished in this sample
