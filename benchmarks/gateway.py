"""Gateway overhead: the admission gateway next to a bare aiohttp reverse proxy, same run.

Three processes on loopback: an upstream that answers at once (a short SSE stream of
``CHUNKS`` tokens, and a vLLM-like ``/metrics``), the proxy under test pinned to one core, and an
open-loop client (Poisson arrivals at ``rate`` req/s for ``seconds``) on the other core. The client
measures each request's latency directly against the upstream (the baseline), through the bare
proxy, and through the gateway running the scenario's registered SLO-aware admission (the
``live_small`` plant with 32 fill and 32 decode workers, so a 500 req/s stream is admitted and the
decision is paid on every request). Added latency = a quantile of the proxied latencies minus the
same quantile of the direct ones; CPU per request = the proxy process's user + system time over
the requests it served (from /proc).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import time

import numpy as np

__all__ = ["gateway_overhead"]

CHUNKS = 8
_METRICS = ('vllm:num_requests_running{model_name="m",engine="0"} 0\n'
            'vllm:num_requests_waiting{model_name="m",engine="0"} 0\n')


def _pin(cpu: int) -> None:
    try:
        os.sched_setaffinity(0, {cpu % os.cpu_count()})
    except (AttributeError, OSError):
        pass


def _upstream(port: int, ready) -> None:
    from aiohttp import web

    _pin(1)
    body = b"".join(b'data: {"choices":[{"index":0,"text":" tok","finish_reason":null}]}\n\n' for _ in range(CHUNKS))
    body += b"data: [DONE]\n\n"

    async def completions(request):
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(body)
        await resp.write_eof()
        return resp

    async def metrics(request):
        return web.Response(text=_METRICS)

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/metrics", metrics)
    ready.set()
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _bare_proxy(port: int, upstream: str, ready) -> None:
    import aiohttp
    from aiohttp import web

    _pin(0)

    async def on_startup(app):
        app["s"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def on_cleanup(app):
        await app["s"].close()

    async def proxy(request):
        raw = await request.read()
        async with request.app["s"].post(upstream + "/v1/completions", data=raw,
                                         headers={"Content-Type": "application/json"}) as up:
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": up.headers.get(
                "Content-Type", "application/json")})
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    app = web.Application()
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_post("/v1/completions", proxy)
    ready.set()
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _gateway(port: int, upstream: str, ready) -> None:
    from aiohttp import web

    from tokenfactory.live.gateway import gateway_app
    from tokenfactory.live.live_scenario import live_scenario_from_dict
    from tokenfactory.scenario import scenario_dir
    from tokenfactory.core.validation import load_toml

    _pin(0)
    d = load_toml(scenario_dir() / "live_small.toml")
    d["plant"] = {**d["plant"], "fill_workers": 32, "decode_workers": 32}
    sc = live_scenario_from_dict(d, "live_small_x32")
    ready.set()
    web.run_app(gateway_app(sc, [upstream]), host="127.0.0.1", port=port, print=None, access_log=None)


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


async def _drive(url: str, rate: float, seconds: float, seed: int) -> tuple[np.ndarray, int]:
    import aiohttp

    rng = np.random.default_rng(seed)
    t_arr = np.cumsum(rng.exponential(1.0 / rate, int(rate * seconds * 1.2)))
    t_arr = t_arr[t_arr < seconds]
    lat = np.full(len(t_arr), np.nan)
    status_bad = 0
    body = b'{"prompt": "hello", "max_tokens": 8, "stream": true}'
    # keep-alive connections, as a load balancer holds them (limit: a pool, not one socket per request)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)) as s:
        async def one(k: int) -> None:
            nonlocal status_bad
            t = time.perf_counter()
            try:
                async with s.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    if r.status != 200:
                        status_bad += 1
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
                status_bad += 1
                return
            lat[k] = time.perf_counter() - t

        t0 = time.perf_counter()
        tasks = []
        for k, ta in enumerate(t_arr):
            d = t0 + ta - time.perf_counter()
            if d > 0:
                await asyncio.sleep(d)
            tasks.append(asyncio.create_task(one(k)))
        await asyncio.gather(*tasks)
    return lat, status_bad


def _client(url: str, rate: float, seconds: float, seed: int, q) -> None:
    _pin(1)
    lat, bad = asyncio.run(_drive(url, rate, seconds, seed))
    q.put((lat.tolist(), bad))


def _run_client(ctx, url, rate, seconds, seed):
    q = ctx.Queue()
    p = ctx.Process(target=_client, args=(url, rate, seconds, seed, q))
    p.start()
    lat, bad = q.get(timeout=seconds * 30 + 120)
    p.join(30)
    return np.asarray(lat), bad


def _start(ctx, target, *args):
    ready = ctx.Event()
    p = ctx.Process(target=target, args=(*args, ready), daemon=True)
    p.start()
    ready.wait(60)
    time.sleep(1.0)  # the server binds after the event
    return p


def gateway_overhead(rate: float = 500.0, seconds: float = 10.0, seed: int = 1) -> dict:
    """Added latency and CPU per request of the gateway and of a bare proxy (module notes).

    Parameters
    ----------
    rate : float
        Requests per second (open loop).
    seconds : float
        Duration of each measured run.
    seed : int
        Arrival seed (the same arrivals for every path).

    Returns
    -------
    dict
        Per path (``direct``, ``bare_proxy``, ``gateway``): latency quantiles (ms), non-200
        answers; per proxy: added p50 / p99 (ms) and CPU ms per request; the ratio of the
        gateway's CPU per request to the bare proxy's.
    """
    from tokenfactory.live.prometheus_server import free_port

    ctx = mp.get_context("spawn")
    pu, pb, pg = free_port(), free_port(), free_port()
    up_url = f"http://127.0.0.1:{pu}"
    procs = [_start(ctx, _upstream, pu)]
    try:
        procs.append(_start(ctx, _bare_proxy, pb, up_url))
        procs.append(_start(ctx, _gateway, pg, up_url))
        out: dict = {"rate_rps": rate, "seconds": seconds, "chunks_per_response": CHUNKS, "cpus": os.cpu_count()}
        paths = {"direct": (up_url, None), "bare_proxy": (f"http://127.0.0.1:{pb}", procs[1].pid),
                 "gateway": (f"http://127.0.0.1:{pg}", procs[2].pid)}
        _run_client(ctx, up_url + "/v1/completions", rate, 2.0, seed + 99)  # warm-up
        for name, (url, pid) in paths.items():
            cpu0 = _cpu_s(pid) if pid else 0.0
            lat, bad = _run_client(ctx, url + "/v1/completions", rate, seconds, seed)
            cpu = (_cpu_s(pid) - cpu0) if pid else float("nan")
            ms = lat * 1e3
            out[name] = {"requests": int(len(lat)), "non_200": int(bad), "p50_ms": float(np.nanquantile(ms, 0.5)),
                         "p99_ms": float(np.nanquantile(ms, 0.99)),
                         "cpu_ms_per_request": float(cpu * 1e3 / len(lat)) if pid else None}
        for name in ("bare_proxy", "gateway"):
            out[name]["added_p50_ms"] = out[name]["p50_ms"] - out["direct"]["p50_ms"]
            out[name]["added_p99_ms"] = out[name]["p99_ms"] - out["direct"]["p99_ms"]
        out["gateway_cpu_over_bare_proxy"] = out["gateway"]["cpu_ms_per_request"] / out["bare_proxy"][
            "cpu_ms_per_request"]
        out["targets"] = {"added_p50_ms": 1.0, "added_p99_ms": 5.0, "cpu_ratio": 1.5}
        out["met"] = {"added_p50": out["gateway"]["added_p50_ms"] < 1.0, "added_p99": out["gateway"]["added_p99_ms"]
                      < 5.0, "cpu_ratio": out["gateway_cpu_over_bare_proxy"] <= 1.5}
        return out
    finally:
        for p in procs:
            p.terminate()
            p.join(10)
