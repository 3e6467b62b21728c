"""The engine emulator over real HTTP on loopback: OpenAI responses, SSE streams, vLLM metrics,
and timing equal to its engine's (the request simulator's)."""

import asyncio
import json
import time

import aiohttp
import pytest

from tokenfactory.live.emulator import EMULATOR_KEY, VLLM_METRICS, emulator_app, estimate_tokens
from tokenfactory.live.exposition import parse_text, sample_value
from tokenfactory.live.live_scenario import live_scenario_from_dict, load_live_scenario
from tokenfactory.core.errors import ConfigError

from live_servers import serving


@pytest.fixture(scope="module")
def sc():
    return load_live_scenario("live_small")


async def _stream(s, url, body):
    t0 = time.monotonic()
    events, times = [], []
    async with s.post(url, json=body) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        async for line in r.content:
            if line.startswith(b"data: "):
                events.append(line[6:].strip())
                times.append(time.monotonic() - t0)
    return events, times


def test_streams_tokens_on_the_engines_clock(sc):
    async def main():
        async with serving(emulator_app(sc)) as (url, app):
            em = app[EMULATOR_KEY]
            async with aiohttp.ClientSession() as s:
                async with s.get(url + "/health") as r:
                    assert r.status == 200
                async with s.get(url + "/v1/models") as r:
                    assert (await r.json())["data"][0]["id"] == sc.live["model_name"]
                body = {"prompt_token_ids": list(range(1000)), "max_tokens": 20, "stream": True,
                        "stream_options": {"include_usage": True}}
                events, times = await _stream(s, url + "/v1/completions", body)
                assert events[-1] == b"[DONE]"
                chunks = [json.loads(e) for e in events[:-1]]
                tokens = [c for c in chunks if c["choices"]]
                assert len(tokens) == 20 and tokens[-1]["choices"][0]["finish_reason"] == "length"
                assert chunks[-1]["usage"] == {"prompt_tokens": 1000, "completion_tokens": 20, "total_tokens": 1020}
                t = em.engine.times(0)
                # the wire's TTFT and end are the engine's, within the clock loop's tick, HTTP and how
                # late the loop woke (a starved process lags the wall clock)
                slack = 0.03 + 2 * em.max_lag_s
                assert t.first_token_s - t.arrival_s - 0.005 <= times[0] <= t.first_token_s - t.arrival_s + slack
                assert times[-1] == pytest.approx(t.completion_s - t.arrival_s, abs=slack)
                # tokens arrive spread over the decode, not in one burst at the end: the engine emits
                # token 10 about 9/19 of the way from token 1 to the last; each token reaches the wire
                # no earlier than 5 ms before and no later than `slack` after the engine emits it
                # (the bound checked on the first and the last), so a loaded loop can shrink the
                # measured share by at most that much
                edge = slack + 0.005
                assert times[10] - times[1] + edge > 0.3 * (times[-1] - times[1] - edge), (times, slack)
                body = {"messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 5}
                async with s.post(url + "/v1/chat/completions", json=body) as r:
                    out = await r.json()
                assert out["object"] == "chat.completion"
                assert out["usage"]["completion_tokens"] == 5
                assert out["usage"]["prompt_tokens"] == estimate_tokens("user: " + "x" * 400 + "\n")
                async with s.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 0}) as r:
                    assert r.status == 400 and "max_tokens" in (await r.json())["message"]
                await asyncio.sleep(sc.metrics_delay_s + 0.1)
                async with s.get(url + "/metrics") as r:
                    text = await r.text()
        return text

    text = asyncio.run(main())
    for name, kind in VLLM_METRICS.items():
        assert f"# TYPE {name} {kind}" in text, name
    samples = parse_text(text)
    assert sample_value(samples, "vllm:request_success_total", finished_reason="length") == 2
    assert sample_value(samples, "vllm:time_to_first_token_seconds_count") == 2
    assert sample_value(samples, "vllm:generation_tokens_total") == 25
    assert sample_value(samples, "vllm:prompt_tokens_total") == 1000 + estimate_tokens("user: " + "x" * 400 + "\n")
    assert sample_value(samples, "vllm:num_requests_running") == 0


def test_metrics_are_published_late(sc):
    # the emulator's state reaches /metrics metrics_delay_s late (the known delay identify recovers)
    async def main():
        async with serving(emulator_app(sc)) as (url, app):
            async with aiohttp.ClientSession() as s:
                task = asyncio.create_task(s.post(url + "/v1/completions",
                                                  json={"prompt_token_ids": [1] * 500, "max_tokens": 60}))
                seen = []
                t0 = time.monotonic()
                while time.monotonic() - t0 < sc.metrics_delay_s + 1.5:
                    sent = time.monotonic() - t0
                    async with s.get(url + "/metrics") as r:
                        v = sample_value(parse_text(await r.text()), "vllm:num_requests_running")
                    seen.append((sent, time.monotonic() - t0, v))
                    await asyncio.sleep(0.02)
                (await task).close()
                arrived = app[EMULATOR_KEY].engine.t0 + app[EMULATOR_KEY].engine.times(0).arrival_s - t0
                lag = app[EMULATOR_KEY].max_lag_s
        return seen, arrived, lag

    seen, arrived, lag = asyncio.run(main())
    # the count became visible between the last poll that read 0 (sent before it) and the first
    # that read 1 (answered after it): that window, however wide a loaded loop makes it, holds the
    # publication time - the engine's arrival plus the delay, plus at most a gauge period (10 ms),
    # a clock tick and the clock loop's measured lateness
    k = next(i for i, (_, _, v) in enumerate(seen) if v >= 1)
    assert k > 0, seen[:3]
    before_sent, first_answered = seen[k - 1][0], seen[k][1]
    late = 0.01 + sc.live["tick_s"] + lag
    assert before_sent - arrived < sc.metrics_delay_s + late, (before_sent - arrived, lag)
    assert first_answered - arrived >= sc.metrics_delay_s, (first_answered - arrived, lag)
    # on a quiet machine the polls (every ~25 ms) pin it to a few tens of ms
    print(f"published between {before_sent - arrived:.3f} and {first_answered - arrived:.3f} s; lag {lag:.3f} s")


def test_live_section_is_validated():
    base = {"plant": {"fill_workers": 1, "decode_workers": 1}}
    with pytest.raises(ConfigError, match="live"):
        live_scenario_from_dict({**base, "live": {"prompt_tokenz": 3}})
    with pytest.raises(ConfigError, match="live.scrape_interval_s"):
        live_scenario_from_dict({**base, "live": {"scrape_interval_s": 0}})
