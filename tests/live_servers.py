"""Servers of the live path started in-process on loopback for a test, and stopped by it."""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from tokenfactory.live.emulator import EMULATOR_KEY, emulator_app
from tokenfactory.live.gateway import GATEWAY_KEY, gateway_app
from tokenfactory.live.prometheus_server import free_port


@contextlib.asynccontextmanager
async def serving(app: web.Application):
    """Run ``app`` on 127.0.0.1 (a free port) for the block; yields its base URL and the app."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def emulator_and_gateway(sc, emulator_log=None, **gateway_kw):
    """An emulator and a gateway in front of it: yields (emulator url, gateway url, emulator, gateway)."""
    async with serving(emulator_app(sc, request_log=emulator_log)) as (eu, eapp):
        async with serving(gateway_app(sc, [eu], **gateway_kw)) as (gu, gapp):
            yield eu, gu, eapp[EMULATOR_KEY], gapp[GATEWAY_KEY]


class LoopLag:
    """How late the running event loop wakes a task that sleeps ``tick_s``, sampled for the block:
    what a busy machine (or a busy loop) adds to any wall-clock interval measured in that loop.

    ``max_s`` is the worst single wake-up's lateness, ``total_s`` their sum (an upper estimate of
    the time the loop was not free to run anything on time).
    """

    def __init__(self, tick_s: float = 0.005):
        self.tick_s, self.max_s, self.total_s = tick_s, 0.0, 0.0
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(self.tick_s)
            late = max(loop.time() - t - self.tick_s, 0.0)
            self.max_s = max(self.max_s, late)
            self.total_s += late

    async def __aenter__(self) -> "LoopLag":
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def __aexit__(self, *exc) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
