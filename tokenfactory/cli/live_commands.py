"""``tokenfactory emulate``, ``gateway``, ``diagnose``, ``identify``: the live tools over a real or
emulated deployment.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenfactory.core.validation import ConfigError

__all__ = ["cmd_emulate", "cmd_gateway", "cmd_diagnose", "cmd_identify"]


def cmd_emulate(args) -> int:
    from aiohttp import web

    from tokenfactory.live.emulator import emulator_app
    from tokenfactory.live.live_scenario import load_live_scenario

    sc = load_live_scenario(args.scenario)
    print(f"emulating {sc.name} ({sc.live['model_name']}) on http://{args.host}:{args.port}", flush=True)
    web.run_app(emulator_app(sc, request_log=args.request_log), host=args.host, port=args.port, print=None, access_log=None)
    return 0


def cmd_gateway(args) -> int:
    from aiohttp import web

    from tokenfactory.live.gateway import gateway_app
    from tokenfactory.live.live_scenario import load_live_scenario

    sc = load_live_scenario(args.scenario)
    kind = sc.replay.admission or "open"
    print(f"gateway {sc.name} ({kind}) on http://{args.host}:{args.port} -> {', '.join(args.upstream)}", flush=True)
    web.run_app(gateway_app(sc, args.upstream, request_log=args.request_log, open_gate=args.open), host=args.host,
                port=args.port,
                print=None, access_log=None)
    return 0


def _live_signals(args, queries=None):
    from tokenfactory.live.diagnose import read_metrics_file, read_prometheus

    if (args.prometheus is None) == (args.metrics is None):
        raise ConfigError("prometheus", "give --prometheus URL (with --start and --end) or --metrics FILE")
    if args.metrics is not None:
        return read_metrics_file(args.metrics, engine=args.engine)
    if args.start is None or args.end is None:
        raise ConfigError("start", "--prometheus needs --start and --end (unix seconds)")
    return read_prometheus(args.prometheus, args.start, args.end, step=args.step, engine=args.engine, queries=queries)


def cmd_diagnose(args) -> int:
    from pathlib import Path

    from tokenfactory.live.diagnose import diagnose

    d = diagnose(_live_signals(args), skip_start_s=args.skip)
    text = d.to_markdown()
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "diagnosis.md").write_text(text)
        (out / "diagnosis.json").write_text(json.dumps(d.to_dict(), indent=2, default=float))
    print(json.dumps(d.to_dict(), indent=2, default=float) if args.json else text)
    return 0


def cmd_identify(args) -> int:
    from tokenfactory.live.diagnose import read_metrics_file
    from tokenfactory.live.identify import identify, read_raw_prometheus, write_scenarios
    from tokenfactory.live.live_scenario import load_live_scenario, saturated_rate

    sc = load_live_scenario(args.scenario) if args.scenario else None
    modelled = saturated_rate(sc) if sc is not None else None
    if (args.prometheus is None) == (args.metrics is None):
        raise ConfigError("prometheus", "give --prometheus URL (with --start and --end) or --metrics FILE")
    if args.metrics is not None:
        data = read_metrics_file(args.metrics, engine=args.engine)
    elif args.start is None or args.end is None:
        raise ConfigError("start", "--prometheus needs --start and --end (unix seconds)")
    else:
        data = read_raw_prometheus(args.prometheus, args.start, args.end)
    log = None
    if args.requests:
        import pandas as pd

        try:
            log = pd.read_json(args.requests, lines=True)
        except ValueError as e:
            raise ConfigError("requests", f"{args.requests}: not a JSON-lines request log ({e})") from None
        log = log[log["status"] == "completed"]
    ident = identify(data, modelled_service_rate=modelled, request_log=log)
    if args.out:
        plant = dict(sc.replay.plant) if sc is not None else {"model": "deepseek-v3", "hardware": "h200"}
        if sc is not None:
            plant.update(fill_workers=sc.cluster.fill_workers, decode_workers=sc.cluster.decode_workers,
                         prompt_tokens=sc.live["prompt_tokens"], output_tokens=sc.live["output_tokens"])
        paths = write_scenarios(ident, plant, args.out, slo=(sc.cluster.slo_ttft_s, sc.cluster.slo_tpot_s) if sc
                                else (2.0, 0.1))
        print("wrote " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)
    print(json.dumps(ident.to_dict(), indent=2, default=float) if args.json else ident.to_pandas().to_string(index=False))
    return 0
