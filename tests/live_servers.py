"""Servers of the live path started in-process on loopback for a test, and stopped by it."""

from __future__ import annotations

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
