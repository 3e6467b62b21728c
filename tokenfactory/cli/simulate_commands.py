"""``tokenfactory simulate``: a trace replayed request by request (the request simulator) or as
rates (the pool model under a stack).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenfactory.core.validation import ConfigError, check_number
from tokenfactory.cli.console import print_table, parse_duration
from tokenfactory.cli.replay_answers import simulate_answer

__all__ = ["cmd_simulate"]


def _simulate_pool_plant(args) -> int:
    from pathlib import Path

    from tokenfactory.scenario import scenario_dir
    from tokenfactory.stack import load_stack_scenario, run_on_rates
    from tokenfactory.traces.rate_workloads import rate_workload
    from tokenfactory.studies.report import to_jsonable

    from tokenfactory.registry import BASELINE_STACKS

    if args.baseline and args.baseline not in BASELINE_STACKS:  # before the stack's run, not after it
        raise ConfigError("baseline", f"{args.baseline!r} is not one of {', '.join(BASELINE_STACKS)}")
    sc = load_stack_scenario(args.stack or scenario_dir() / "stack_default.toml")
    wl = rate_workload(args.trace, scale=args.rate_scale, last_days=args.last_days,
                       hours=None if args.hours is None else float(args.hours))
    keys = ("gpu_hours", "oracle_gpu_hours", "slo_attainment", "actions_per_hour", "reversals_per_hour",
            "oscillating")
    out = Path(args.out or Path("reports") / "simulate" / f"{Path(args.trace).stem.replace(':', '-')}-pools")
    out.mkdir(parents=True, exist_ok=True)
    row, res, ctrl = run_on_rates(sc, wl, startup_s=args.startup, stack="stack", seed=args.seed)
    metrics = {**{k: row[k] for k in keys}, "stack": row, "trace": args.trace, "scenario": sc.name,
               "startup_s": row["startup_s"], "config": {"stack": ctrl.params(), "pool_model": res.config}}
    res.series.to_csv(out / "series.csv", index=False)
    res.actions.to_csv(out / "actions.csv", index=False)
    if args.baseline:
        brow, bres, _ = run_on_rates(sc, wl, startup_s=args.startup, stack=args.baseline, seed=args.seed,
                                     ceiling=row["utilization_ceiling"])
        metrics["baseline"] = {"name": args.baseline, **{k: brow[k] for k in keys}, "row": brow}
        bres.series.to_csv(out / "baseline_series.csv", index=False)
    (out / "metrics.json").write_text(json.dumps(to_jsonable(metrics), indent=2) + "\n")
    print_table({k: row[k] for k in keys})
    if args.baseline:
        print(f"baseline {args.baseline}:")
        print_table({k: metrics["baseline"][k] for k in keys})
    print(f"wrote {out}/ (metrics.json, series.csv, actions.csv)")
    return 0


def cmd_simulate(args) -> int:
    """``simulate``: the pool model (``--plant pools``) or the request simulator on a request trace."""
    # each plant reads its own flags (tagged where the parser adds them): one given to the other
    # plant would be silently ignored there, so it is an error naming it
    hint = {"des": "needs --plant des (the pools plant runs a stack scenario: give --stack)",
            "pools": "needs --plant pools (the request simulator's settings come from --scenario, --scale, --load)"}
    for dest, (plant, default) in args.plant_flags.items():
        if plant != args.plant and getattr(args, dest) != default:
            raise ConfigError(dest, hint[plant])
    if args.plant == "pools":
        return _simulate_pool_plant(args)
    from tokenfactory.replay import build_replay, load_replay_scenario, run_replay

    sc = load_replay_scenario(args.scenario) if args.scenario else None
    run = _replay_settings(args, sc)
    trace_name, trace = _requests_to_replay(args)
    if trace_name != "synthetic" and args.duration is not None:   # a real trace: replay its first --duration
        run.simulation["duration_s"] = check_number("duration", parse_duration(args.duration), low=0.0,
                                                    low_inclusive=False)
    print(f"building the replay: {len(trace):,} requests, service tables and per-request costs ...", flush=True)
    setup = build_replay(trace, run.plant)
    scaler_params, scalers = _pool_sizing(args, run.scaler_params)
    m, res = run_replay(trace, setup, run.admission, run.scale, run.cluster, autoscaler=args.autoscaler, load=run.load,
                        autoscalers=scalers, autoscaler_params=scaler_params,
                        admission_params=run.admission_params,
                        batch_cap=None if run.batch_cap == "none" else run.batch_cap,
                        envelope=sc.envelope if sc else None, duration_s=run.simulation.get("duration_s"),
                        admission_where="controller", capacity=args.capacity, capacity_cache=args.capacity_cache)
    trace_label = args.trace if trace_name == args.trace else f"synthetic stand-in for {args.trace}"
    out = _replay_folder(args, run.admission, trace_name)
    _write_replay(out, m, res, trace_label, sc.name if sc else None)
    _print_replay(m)
    simulate_answer(setup, m, res, trace_label)
    print(f"wrote {out}/ (metrics.json, requests.csv, series.csv, actions.csv)")
    return 0


@dataclass
class _ReplaySettings:
    """What ``simulate`` replays with: the scenario's tables overridden by the flags, checked."""

    plant: dict
    cluster: dict
    simulation: dict
    admission: str
    admission_params: dict
    scaler_params: dict | None
    load: float | None
    scale: float
    batch_cap: Any


def _replay_settings(args, sc) -> _ReplaySettings:
    """The flags over the scenario's tables, each checked (in the order a user reads them)."""
    from tokenfactory.core.classes import DEFAULT_CLASSES, INTERACTIVE, RequestClass
    from tokenfactory.core.validation import check_choice, check_number
    from tokenfactory.registry import ADMISSION_KINDS, AUTOSCALER_KINDS, RECOMMENDED_ADMISSION

    plant = dict(sc.plant) if sc else {}
    if args.params is not None:   # the named set over the scenario's plant.params (plant.efficiency still over it)
        plant["params"] = args.params
    cluster = dict(sc.cluster) if sc else {}
    sim = dict(sc.simulation) if sc else {}
    admission = args.admission or (sc.admission if sc else None) or RECOMMENDED_ADMISSION
    params = dict(sc.admission_params) if sc and admission == sc.admission else {}
    check_choice("admission", admission, ADMISSION_KINDS)
    if args.autoscaler is not None:
        check_choice("autoscaler", args.autoscaler, AUTOSCALER_KINDS)
    scaler_params = _autoscaler_params(args.autoscaler_param) or None
    if scaler_params and args.autoscaler is None:
        raise ConfigError("autoscaler_param", "needs --autoscaler (the kind whose parameter it is)")
    if args.load is not None and args.scale is not None:
        raise ConfigError("load", "give --load or --scale, not both")
    load = args.load if args.load is not None else (None if args.scale is not None else sim.get("load"))
    scale = args.scale if args.scale is not None else sim.get("scale", 1.0)
    if load is not None:
        check_number("load", load, low=0.0, low_inclusive=False)
    check_number("scale", scale, low=0.0, low_inclusive=False)
    batch_cap = args.batch_cap if args.batch_cap is not None else sim.get("batch_cap")
    if batch_cap not in (None, "static", "none"):
        batch_cap = check_number("batch_cap", float(batch_cap), low=1.0)
    cluster.setdefault("seed", args.seed)
    if "classes" not in cluster:  # the trace's classes, the interactive one at the cluster's SLO
        ttft, tpot = cluster.get("slo_ttft_s", 2.0), cluster.get("slo_tpot_s", 0.1)
        cluster["classes"] = (RequestClass(INTERACTIVE, ttft, tpot, 0),
                              *(c for c in DEFAULT_CLASSES if c.name != INTERACTIVE))
    if args.progress is not None:
        cluster["progress"] = args.progress
    return _ReplaySettings(plant, cluster, sim, admission, params, scaler_params, load, scale, batch_cap)


def _requests_to_replay(args):
    """``(name run, requests)``: the trace, or the synthetic stand-in for a registered trace not on
    this machine (said so), or the embedded generator's ``--duration``."""
    from tokenfactory.traces import SyntheticWorkload, generate_requests, load_trace

    trace_name = _trace_or_standin(args.trace)
    duration = args.duration or "1h"
    if trace_name != args.trace:
        print(f"{args.trace} is not on this machine (`tokenfactory traces fetch {args.trace}` downloads it): "
              f"running on the synthetic stand-in for it ({duration} of the embedded workload, seed {args.seed})",
              flush=True)
    if trace_name == "synthetic":
        expected = SyntheticWorkload(seed=args.seed).mean_rate_rps * parse_duration(duration)
        print(f"generating {duration} of synthetic requests (about {expected:,.0f}, seed {args.seed}) ...",
              flush=True)
    trace = (generate_requests(SyntheticWorkload(seed=args.seed), parse_duration(duration))
             if trace_name == "synthetic" else load_trace(args.trace))
    return trace_name, trace


def _pool_sizing(args, scaler_params: dict | None):
    """``(autoscaler parameters, autoscalers)``: a Dynamo planner config joins the parameters, a
    control plane's own file becomes the autoscaler of ``--pool`` (Dynamo's real planner: the
    registered kind, ``args.autoscaler`` set to it)."""
    if args.planner_config is not None:
        if args.autoscaler is None:
            raise ConfigError("planner_config", "needs --autoscaler dynamo-planner")
        # the registry rejects it for a kind that takes no planner_config
        scaler_params = {**(scaler_params or {}), "planner_config": _planner_config_file(args.planner_config)}
    scalers = None
    if args.control_plane:
        from tokenfactory.controllers.formats import read_control_plane

        if args.autoscaler:
            raise ConfigError("control_plane", "give --control-plane or --autoscaler, not both")
        setting = read_control_plane(args.control_plane)
        if hasattr(setting, "registered_autoscaler"):   # Dynamo's real planner: both pools, the plant's engines
            args.autoscaler, scaler_params = setting.registered_autoscaler()
        else:
            scalers = [setting.build(args.pool)]
    return scaler_params, scalers


def _replay_folder(args, admission: str, trace_name: str) -> Path:
    """``--out``, else ``reports/simulate/<trace>-<admission>[-<autoscaler>][-<control plane>]``."""
    tag = admission + (f"-{args.autoscaler}" if args.autoscaler else "") + (
        f"-{Path(args.control_plane).stem}" if args.control_plane else "")
    stem = Path(args.trace).stem.replace(':', '-') + ("-synthetic-standin" if trace_name != args.trace else "")
    out = Path(args.out or Path("reports") / "simulate" / f"{stem}-{tag}")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _write_replay(out: Path, m: dict, res, trace_label: str, scenario: str | None) -> None:
    """metrics.json (the run's metrics, config and capacity figures), requests.csv, series.csv, actions.csv."""
    from tokenfactory.studies.report import to_jsonable

    cap = m["capacity"]  # of the simulated cluster (its pools, SLOs, classes; events excluded)
    (out / "metrics.json").write_text(json.dumps(to_jsonable({
        **m, "config": res.config, "trace": trace_label, "scenario": scenario,
        "bottleneck": cap["bottleneck"], "capacity_rps": cap["kv_rps"],
        "slo_capacity_rps": cap["rps"], "slo_capacity_source": cap["source"],
        "model_capacity_rps": cap["model_rps"], "measured_capacity_rps": cap["measured_rps"],
        "slo_bottleneck": cap["bottleneck"], "slo_batch_cap": cap["batch_cap"]}), indent=2) + "\n")
    res.records.to_csv(out / "requests.csv", index=False)
    res.series.to_csv(out / "series.csv", index=False)
    res.actions.to_csv(out / "actions.csv", index=False)


def _print_replay(m: dict) -> None:
    """The run's headline metrics, its capacity at the SLO and each class's outcome."""
    cap = m["capacity"]
    keys = ("requests", "completed", "rejected", "deferred", "in_flight_end", "ttft_p50", "ttft_p99", "tpot_p50",
            "tpot_p99", "slo_attainment", "slo_attainment_admitted", "goodput_tokens_per_s", "wasted_prefill_tokens",
            "prefix_hit_ratio", "gpu_hours", "actions_per_hour", "reversals_per_hour", "wall_seconds",
            "sim_requests_per_wall_s")
    # the per-hour rates are over the whole run (window_s); the churn line's are over the judged window
    whole = {"actions_per_hour", "reversals_per_hour"}
    print_table({(f"{k} (whole run)" if k in whole else k): m[k] for k in keys if m.get(k) is not None})
    print(f"service-model parameters: {m['parameter_set']['label']}")
    print(f"capacity at the SLO of {cap['cluster']['fill_workers']} fill + {cap['cluster']['decode_workers']} decode: "
          f"model {cap['model_rps']:.3f} req/s ({cap['bottleneck']}-bound, batch cap {cap['batch_cap']:.0f})"
          + (f", measured {cap['measured_rps']:.3f} req/s (open admission at {cap['measured']['target_attainment']:.3f} "
             f"SLO attainment)" if cap["measured_rps"] is not None else "")
          + (f"; --load {m['load']:g} = {m['load'] * cap['rps']:.3f} req/s" if m["load"] is not None else ""))
    for name, cm in m["classes"].items():
        print(f"class {name}: {cm['requests']} requests, SLO attainment {cm['slo_attainment']:.3f} "
              f"(admitted {cm['slo_attainment_admitted'] if cm['slo_attainment_admitted'] is not None else float('nan'):.3f}), "
              f"{cm['rejected']} rejected, {cm['deferred']} deferred")


def _planner_config_file(path: str) -> dict:
    """A Dynamo planner config file (YAML or JSON, Dynamo's own ``PlannerConfig`` fields; TOML too)."""
    from pathlib import Path

    from tokenfactory.core.validation import load_toml

    f = Path(path)
    if not f.is_file():
        raise ConfigError("planner_config", f"{path} is not a file")
    if f.suffix == ".toml":
        data = load_toml(f)
    else:
        import yaml  # JSON is YAML; PyYAML comes with the dynamo extra (Dynamo reads its configs with it)

        try:
            data = yaml.safe_load(f.read_text())
        except yaml.YAMLError as e:
            raise ConfigError("planner_config", f"{path}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError("planner_config", f"{path} holds no table of PlannerConfig fields")
    return data


def _trace_or_standin(name: str) -> str:
    """``name``, or ``"synthetic"`` when it is a registered trace that is not on this machine."""
    from tokenfactory.traces import TRACES, trace_available

    return "synthetic" if name in TRACES and not trace_available(name) else name


def _autoscaler_params(pairs: list[str] | None) -> dict:
    """``KEY=VALUE`` pairs of ``--autoscaler-param`` as a table (a value reads as an integer, a
    number, true/false or else a string); the registry checks each key and value for the kind."""
    out: dict = {}
    for pair in pairs or ():
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError("autoscaler_param", f"{pair!r} is not KEY=VALUE (e.g. decode_min_replicas=4)")
        value: Any = text.strip()
        for cast in (int, float):
            try:
                value = cast(value)
                break
            except ValueError:
                continue
        if value in ("true", "false"):
            value = value == "true"
        out[key.strip()] = value
    return out
