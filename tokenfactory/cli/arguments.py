"""The command line's arguments: one small function per subcommand, in the order ``--help`` lists
them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tokenfactory.cli.calibrate_commands import cmd_calibrate
from tokenfactory.cli.certify_commands import cmd_advise, cmd_certify, cmd_margins
from tokenfactory.cli.describe_commands import cmd_describe
from tokenfactory.cli.live_commands import cmd_diagnose, cmd_emulate, cmd_gateway, cmd_identify
from tokenfactory.cli.simulate_commands import cmd_simulate
from tokenfactory.cli.study_commands import cmd_report, cmd_study
from tokenfactory.cli.trace_commands import cmd_forecast, cmd_traces
from tokenfactory.plant_models.calibration import PARAMETER_SETS

__all__ = ["build_parser"]


def build_parser() -> argparse.ArgumentParser:
    """The ``tokenfactory`` parser: every subcommand, each with its handler as ``func``."""
    from tokenfactory import cli

    p = argparse.ArgumentParser(prog="tokenfactory", description=cli.__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for add in _SUBCOMMANDS:
        add(sub)
    return p


def _add_describe(sub) -> None:
    """``describe``: derived figures, the registered kinds, the schema of every file a user writes."""
    d = sub.add_parser("describe", help="derived figures of a model, an accelerator or a worker; the "
                                        "registered controller kinds; the keys of every file you write (schema)")
    d.add_argument("what", choices=["model", "hardware", "worker", "kinds", "schema"])
    d.add_argument("name", nargs="?", default=None,
                   help="preset name or TOML file (for worker: the model); for schema: a section, one of "
                        "model, hardware, scenario, cluster, margins, stack, live, kinds (default: all)")
    d.add_argument("--json", action="store_true", help="machine-readable output")
    d.add_argument("--format", choices=["text", "markdown", "json"], default="text",
                   help="schema: output format (default text)")
    d.add_argument("--hardware", default="h200", help="worker: accelerator preset or TOML")
    d.add_argument("--tp", type=int, default=1)
    d.add_argument("--pp", type=int, default=1)
    d.add_argument("--ep", type=int, default=8)
    d.add_argument("--prompt-tokens", type=int, default=2048, help="worker: nominal prompt")
    d.add_argument("--output-tokens", type=int, default=512, help="worker: nominal output")
    d.add_argument("--context-tokens", type=int, default=None,
                   help="worker: decode context for slots and pass time (default: the mean active context "
                        "of the prompt and output)")
    d.set_defaults(func=cmd_describe)


def _add_margins(sub) -> None:
    """``margins``: a scenario file's stability margins."""
    m = sub.add_parser("margins", help="stability margins (or predicted limit cycles) of a scenario file")
    m.add_argument("scenario", help="scenario TOML (see tokenfactory/scenarios/)")
    m.add_argument("--json", action="store_true")
    m.add_argument("--check", action="store_true",
                   help="exit 1 if any envelope point is unstable (Nyquist count) or misses the floors")
    m.set_defaults(func=cmd_margins)


def _add_forecast(sub) -> None:
    """``forecast``: backtest forecasters on a trace and plan capacity from the best."""
    f = sub.add_parser("forecast", help="backtest forecasters on a trace and plan capacity from the best")
    f.add_argument("--trace", required=True, help="registered name (tokenfactory traces list), path, or 'synthetic'")
    f.add_argument("--horizon", choices=["1h", "1d"], default="1d")
    f.add_argument("--models", default=None, help="comma-separated (default: all)")
    f.add_argument("--out", default=None)
    f.add_argument("--interval", type=float, default=600.0, help="bin width (s) for request traces")
    f.add_argument("--test-days", type=float, default=4.0)
    f.add_argument("--model", default="deepseek-v3", help="served model for the capacity plan")
    f.add_argument("--hardware", default="h200", help="worker hardware for the capacity plan")
    f.add_argument("--headroom", type=float, default=0.2)
    f.add_argument("--max-moves", type=int, default=2, help="worker moves per pool per hour")
    f.add_argument("--quantile", default="upper_80", help="mean, upper_80 or upper_95")
    f.set_defaults(func=cmd_forecast)


def _plant_flag(parser: argparse.ArgumentParser, plant: str, *names, **kwargs) -> argparse.Action:
    """Add a flag only ``plant`` reads, recorded with its default in the parser's ``plant_flags``
    (``dest -> (plant, default)``) so that the other plant can reject it by name."""
    action = parser.add_argument(*names, **kwargs)
    parser.get_default("plant_flags")[action.dest] = (plant, action.default)
    return action


def _add_simulate(sub) -> None:
    """``simulate``: a trace replayed through the cluster (request simulator or pool model)."""
    sm = sub.add_parser("simulate", help="replay a trace request by request through the cluster")
    # flags one plant reads (the rest are shared): cmd_simulate rejects each on the other plant
    sm.set_defaults(plant_flags={})
    sm.add_argument("--trace", required=True, help="registered name, path, or 'synthetic'")
    _plant_flag(sm, "des", "--scale", type=float, default=None, help="replay x times faster (default 1)")
    _plant_flag(sm, "des", "--load", type=float, default=None,
                    help="offered load as a multiple of the simulated cluster's capacity at the SLO (instead of "
                         "--scale; closed sessions need it): by default the capacity measured by bisection under "
                         "open admission (cached in --capacity-cache), see --capacity")
    sm.add_argument("--capacity", choices=["measured", "model"], default="measured",
                    help="what --load multiplies: 'measured' (open admission at the knee, bisection in the request "
                         "simulator on the cluster without its events) or 'model' (the model's estimate, no runs); "
                         "both are recorded in metrics.json")
    sm.add_argument("--capacity-cache", dest="capacity_cache", default=str(Path("reports") / "cache"),
                    help="folder of the measured capacities (one JSON per trace, plant and cluster; default "
                         "reports/cache)")
    _plant_flag(sm, "des", "--scenario", default=None,
                    help="TOML with [plant], [cluster], [classes], [controller], [envelope], [simulation]; every "
                         "field is used or rejected by name")
    _plant_flag(sm, "des", "--params", default=None, choices=list(PARAMETER_SETS),
                    help="the service model's named parameter set, as calibrate score --params takes it ("
                         + "; ".join(f"{k}: {v}" for k, v in PARAMETER_SETS.items())
                         + "): its efficiencies, with the scenario's plant.efficiency over single fields; "
                           "overrides the scenario's plant.params (default: the plant's default efficiencies)")
    _plant_flag(sm, "des", "--admission", default=None,
                    help="an admission kind (tokenfactory describe kinds); default the scenario's, else the "
                         "recommended slo-aware")
    _plant_flag(sm, "des", "--batch-cap", dest="batch_cap", default=None,
                    help="decode batch cap per worker at the start: 'static' (the largest batch meeting the TPOT "
                         "SLO at the nominal context), 'none' (KV memory only; default) or a number")
    _plant_flag(sm, "des", "--autoscaler-param", dest="autoscaler_param", action="append", default=None, metavar="KEY=VALUE",
                    help="a parameter of the --autoscaler kind, repeatable (hysteretic: fill_min_replicas, "
                         "decode_min_replicas - a floor per pool)")
    _plant_flag(sm, "des", "--autoscaler", default=None,
                    help="an autoscaler kind sizing both pools (tokenfactory describe kinds); start-up/warm-up "
                         "from the scenario's [cluster.dynamics]")
    _plant_flag(sm, "des", "--planner-config", dest="planner_config", default=None,
                    help="with --autoscaler dynamo-planner: a Dynamo planner config file (YAML/JSON, Dynamo's "
                    "own PlannerConfig fields: optimization_target, load_predictor, ttft_ms, ...)")
    _plant_flag(sm, "des", "--control-plane", dest="control_plane", default=None,
                    help="a control plane's own settings file (Kubernetes HPA, KEDA ScaledObject, Knative Service, "
                         "Ray Serve config, AIBrix PodAutoscaler) sizing --pool with exactly its parameters, or a "
                         "Dynamo planner config (the real planner, sizing both pools)")
    sm.add_argument("--pool", choices=["decode", "fill"], default="decode",
                    help="the pool --control-plane sizes (the other stays fixed)")
    sm.add_argument("--seed", type=int, default=0)
    sm.add_argument("--duration", default=None,
                    help="synthetic: the trace's length (default 1h); a trace file or registered trace: replay "
                         "its first DURATION (the scenario's [simulation] duration_s)")
    sm.add_argument("--out", default=None)
    sm.add_argument("--progress", dest="progress", action="store_true", default=None, help="force the progress bar")
    sm.add_argument("--no-progress", dest="progress", action="store_false")
    sm.add_argument("--plant", choices=["des", "pools"], default="des",
                    help="des: request simulator on a request trace; pools: the pool model on a rate series "
                         "(ServeGen aggregate format included) run by a control stack")
    _plant_flag(sm, "pools", "--stack", default=None, help="pools: stack scenario TOML (default tokenfactory/scenarios/"
                                                  "stack_default.toml)")
    _plant_flag(sm, "pools", "--startup", type=float, default=None, help="pools: worker start-up (s), overrides the scenario")
    _plant_flag(sm, "pools", "--last-days", type=float, default=None, help="pools: run the last N days (the days before "
                                                                  "are the planner's history)")
    _plant_flag(sm, "pools", "--hours", type=float, default=None, help="pools: run only the first N hours")
    _plant_flag(sm, "pools", "--rate-scale", type=float, default=1.0, help="pools: multiply the rates")
    _plant_flag(sm, "pools", "--baseline", default=None, help="pools: also run a baseline deployment (tokenfactory.registry."
                                                     "BASELINE_STACKS)")
    sm.set_defaults(func=cmd_simulate)


def _add_certify(sub) -> None:
    """``certify``: a stack scenario's certificate."""
    ce = sub.add_parser("certify", help="the stack certificate of a stack scenario: margins, separation, "
                                        "describing functions, verdict")
    ce.add_argument("scenario", help="stack scenario TOML or a shipped name (stack_default)")
    ce.add_argument("--json", action="store_true")
    ce.add_argument("--check", action="store_true", help="exit 1 if any floor fails")
    ce.set_defaults(func=cmd_certify)


def _add_advise(sub) -> None:
    """``advise``: a control plane's own settings file certified, tuned and simulated."""
    ad = sub.add_parser("advise", help="certify a control plane's own settings file (Kubernetes HPA, KEDA, Knative, "
                                       "Ray Serve, AIBrix, a Dynamo planner config) on a scenario, search its knobs, "
                                       "simulate, and write the recommended file in the same format")
    ad.add_argument("--control-plane", dest="control_plane", required=True, help="the settings file (YAML)")
    ad.add_argument("--scenario", required=True, help="the plant and cluster (the simulate scenario TOML)")
    ad.add_argument("--trace", default=None, help="requests to replay: registered name, path, or 'synthetic' "
                                                  "(default)")
    ad.add_argument("--pool", choices=["decode", "fill"], default="decode", help="the pool the control plane sizes")
    ad.add_argument("--slo-target", dest="slo_target", type=float, default=None,
                    help="SLO attainment the recommendation must reach (default 0.99)")
    ad.add_argument("--candidates", type=int, default=6, help="certified candidates replayed (default 6; the floor bisection takes at least "
                         "log2(floors) + 1 of them)")
    ad.add_argument("--duration", default="1h", help="synthetic trace length")
    ad.add_argument("--seed", type=int, default=0)
    ad.add_argument("--out", default=None, help="output folder (default reports/advise/<file>)")
    ad.set_defaults(func=cmd_advise)


def _add_traces(sub) -> None:
    """``traces``: list, fetch, describe, fit or synthesise traces."""
    t = sub.add_parser("traces", help="list, fetch, describe, fit or synthesise traces")
    t.add_argument("action", choices=["list", "info", "fit", "synth", "fetch"])
    t.add_argument("name", nargs="?", help="info/fit: registered name or path; fetch: registered name or all")
    t.add_argument("--dir", default=None, help="fetch: trace folder to store into (default $TOKENFACTORY_TRACES, "
                                               "else ~/.local/share/tokenfactory/traces)")
    t.add_argument("--mirror", default=None, help="fetch: base URL holding the files under their upstream names, "
                                                  "instead of the upstream URLs")
    t.add_argument("--json", action="store_true")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--kind", choices=["requests", "rates"], default="requests", help="synth: what to write")
    t.add_argument("--duration", default="1h", help="synth: e.g. 3600, 1h, 14d")
    t.add_argument("--interval", type=float, default=600.0, help="synth rates: window (s)")
    t.add_argument("--rate", type=float, default=None, help="synth: mean requests/s")
    t.add_argument("--agentic", type=float, default=None, help="synth: fraction of traffic in agentic sessions")
    t.add_argument("--out", default="synthetic.csv", help="synth: output CSV")
    t.set_defaults(func=cmd_traces)


def _add_calibrate(sub) -> None:
    """``calibrate``: the service model scored against measured runs, or fitted to them."""
    ca = sub.add_parser("calibrate", help="score the service model against measured serving runs, or fit it to them")
    ca.add_argument("action", choices=["score", "fit"])
    ca.add_argument("file", help="silicon-format CSV, a TOML of [[points]], or `published`")
    ca.add_argument("--out", default=None, help="score: folder for metrics.json and rows.csv; fit: for fit.json")
    ca.add_argument("--method", choices=["des", "steady-state"], default="des",
                    help="score: the request simulator (default) or the closed-loop steady-state solve")
    ca.add_argument("--params", choices=list(PARAMETER_SETS), default="defaults",
                    help="score: " + "; ".join(f"{k}: {v}" for k, v in PARAMETER_SETS.items()))
    ca.add_argument("--limit", type=int, default=None, help="only the first N mapped runs (a quick subset)")
    ca.add_argument("--stratified", action="store_true", help="--limit: one run per group first (GPU, engine, "
                                                               "model, mode, batch band)")
    ca.add_argument("--seed", type=int, default=0)
    ca.add_argument("--per-group", type=int, default=3, help="fit: training runs per group")
    ca.add_argument("--max-nfev", type=int, default=40, help="fit: residual evaluations per optimisation")
    ca.add_argument("--no-cv", action="store_true", help="fit: skip the cross-validation")
    ca.add_argument("--fix", action="append", metavar="PARAM",
                    help="fit: hold this calibration parameter at its start (repeatable; a small file cannot fit all)")
    ca.add_argument("--fit-mode", choices=["joint", "two-stage", "joint-two-stage"], default="joint",
                    help="fit: every parameter on the sample at once (joint, default), the TTFT terms on every "
                         "run and the efficiencies on the sample, alternating (two-stage), or the joint fit "
                         "followed by the two stages (joint-two-stage)")
    ca.add_argument("--alternations", type=int, default=1, help="fit: two-stage rounds (efficiencies, then TTFT terms; 0 allowed after the joint fit)")
    ca.add_argument("--jobs", type=int, default=1, help="fit: the full fit and the folds in up to N processes")
    ca.add_argument("--write", action="store_true", help="fit: write the calibrated set (plant_models/calibrated.py)")
    ca.set_defaults(func=cmd_calibrate)


def _add_study(sub) -> None:
    """``study``: run a study (or the suite) and write its report."""
    from tokenfactory.studies import STUDIES

    s = sub.add_parser("study", help="run a study (or `all`) and write its report")
    s.add_argument("name", choices=[*STUDIES, "all"])
    s.add_argument("--out", default=None, help="output folder (default reports/<study>; with --quick "
                                               "reports-quick/<study>)")
    s.add_argument("--quick", action="store_true", help="the quick variant (fewest points; what the tests run)")
    s.add_argument("--full", action="store_true",
                   help="the heavy grids (more models, longer runs); the default is what `make run` runs")
    s.add_argument("--jobs", type=int, default=None,
                   help="`study all`: studies run in N processes at once (default min(2, CPUs))")
    s.add_argument("--workers", type=int, default=None,
                   help="run the studies' grids on a local Dask cluster of N worker processes")
    s.add_argument("--scheduler", default=None,
                   help="run the studies' grids on an existing Dask cluster (scheduler address, e.g. "
                        "tcp://10.0.0.5:8786; or set TOKENFACTORY_DASK_SCHEDULER)")
    s.set_defaults(func=cmd_study)


def _add_emulate(sub) -> None:
    """``emulate``: an OpenAI-compatible engine emulator."""
    em = sub.add_parser("emulate", help="serve an OpenAI-compatible engine emulator timed by the request simulator")
    em.add_argument("--scenario", required=True, help="live scenario TOML (studies/scenarios/live_small.toml)")
    em.add_argument("--port", type=int, default=8000)
    em.add_argument("--host", default="127.0.0.1")
    em.add_argument("--request-log", default=None, help="append one JSON line per finished request to this file "
                    "(engine and wall-clock times of its arrival, first token and first write)")
    em.set_defaults(func=cmd_emulate)


def _add_gateway(sub) -> None:
    """``gateway``: an admission gateway in front of engines."""
    gw = sub.add_parser("gateway", help="an admission gateway (reverse proxy) running the scenario's controller")
    gw.add_argument("--upstream", action="append", required=True, help="engine base URL (repeatable)")
    gw.add_argument("--scenario", required=True, help="live scenario TOML")
    gw.add_argument("--port", type=int, default=8080)
    gw.add_argument("--host", default="127.0.0.1")
    gw.add_argument("--request-log", default=None, help="append one JSON line per finished request to this file")
    gw.add_argument("--open", action="store_true", help="admit everything (measure and log only: identification runs)")
    gw.set_defaults(func=cmd_gateway)


def _add_diagnose_and_identify(sub) -> None:
    """``diagnose`` and ``identify``: a deployment's recorded metrics (they read the same sources)."""
    for name, helptext in (("diagnose", "oscillation diagnosis of a deployment's metrics (Prometheus or a file)"),
                           ("identify", "fit delays, service rates and the admission gain from recorded metrics")):
        q = sub.add_parser(name, help=helptext)
        q.add_argument("--prometheus", default=None, help="Prometheus base URL")
        q.add_argument("--start", type=float, default=None, help="unix seconds")
        q.add_argument("--end", type=float, default=None, help="unix seconds")
        q.add_argument("--step", type=float, default=1.0, help="query resolution (s)")
        q.add_argument("--metrics", default=None, help="saved query_range JSON or CSV instead of --prometheus")
        q.add_argument("--engine", default="vllm", choices=["vllm", "sglang", "dynamo"])
        q.add_argument("--out", default=None, help="folder for the report / scenario files")
        q.add_argument("--json", action="store_true")
        if name == "diagnose":
            q.add_argument("--skip", type=float, default=0.0, help="seconds of start-up transient to leave out")
            q.set_defaults(func=cmd_diagnose)
        else:
            q.add_argument("--scenario", default=None, help="the live scenario the data came from (modelled rates, "
                           "the plant written into the identified scenario)")
            q.add_argument("--requests", default=None, help="the gateway's request log (--request-log): the metric "
                           "delay is fitted on its exact in-flight count")
            q.set_defaults(func=cmd_identify)


def _add_report(sub) -> None:
    """``report``: the HTML page over a folder of study reports."""
    r = sub.add_parser("report", help="(re)build the HTML report index.html over a folder of study reports")
    r.add_argument("dir", nargs="?", default="reports", help="folder with one sub-folder per study")
    r.set_defaults(func=cmd_report)


#: the subcommands in the order ``tokenfactory --help`` lists them
_SUBCOMMANDS = (_add_describe, _add_margins, _add_forecast, _add_simulate, _add_certify, _add_advise, _add_traces,
               _add_calibrate, _add_study, _add_emulate, _add_gateway, _add_diagnose_and_identify, _add_report)
