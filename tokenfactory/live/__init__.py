"""The live path: an engine emulator, an admission gateway, Prometheus, diagnosis and identification.

One idea per module: :mod:`~tokenfactory.live.live_scenario` (live scenario files),
:mod:`~tokenfactory.live.engine` (the request simulator on the wall clock),
:mod:`~tokenfactory.live.exposition` (Prometheus text), :mod:`~tokenfactory.live.emulator` (the
OpenAI-compatible engine emulator), :mod:`~tokenfactory.live.gateway` (the admission gateway),
:mod:`~tokenfactory.live.prometheus_server` (a real Prometheus for tests and studies),
:mod:`~tokenfactory.live.diagnose` (oscillation diagnosis from metrics) and
:mod:`~tokenfactory.live.identify` (fitting the plant from recorded series).
"""
