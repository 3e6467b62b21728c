"""Study `feedback-oscillation`: section 18 of the reference article as a model you can analyse.

(a) the naive completion-triggered loop settles into a limit cycle whose period and amplitude
the describing function predicts; (b) the auto-tuned smoothed loop does not, at the nominal
delay and at 0.5x and 2x; (c) step and disturbance responses; (d) Nyquist with the
describing-function locus; (e) a stability map over delay x controller gain.

Run: ``tokenfactory study feedback-oscillation [--quick] [--out DIR]``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from tokenfactory.controllers import (
    CompletionTriggeredAdmission,
    DelayedLoop,
    SmoothedAdmission,
    ThresholdAdmission,
    admission_loop,
    assess,
    disturbance_metrics,
    stability_map,
    stability_margins,
    step_metrics,
)
from tokenfactory.controllers.analysis_plots import nyquist_plot, stability_map_plot
from tokenfactory.plant_models import (
    DecodeRateDip,
    DecodeWorkersLost,
    DemandStep,
    FluidLoopPlant,
    FluidPlant,
    LoopScenario,
)
from tokenfactory.plant_models.plots import loop_response_plot
from tokenfactory.studies.study_config import StudyVariants, resolve_study_config
from tokenfactory.studies.report import StudyReport
from tokenfactory.scenario import load_scenario, naive_limit_cycle, scenario_dir

__all__ = ["CONFIG", "run", "scenario_path"]

SETTLE_BAND = 0.05      # settle within +/-5 % of the ready target
ASSESS_DT = 0.05        # detectors see the ready buffer sampled every 50 ms
MIN_AMPLITUDE = 1.0     # requests: ripple below one request is not an oscillation


def scenario_path(kind: str) -> Path:
    """The shipped example scenario for ``kind`` ("naive" or "smoothed")."""
    return scenario_dir() / f"feedback_oscillation_{kind}.toml"


#: the study's settings: the defaults and its quick variant (:mod:`tokenfactory.studies.study_config`)
CONFIG = StudyVariants("feedback-oscillation", {
    "naive_scenario": str(scenario_path("naive")), "smoothed_scenario": str(scenario_path("smoothed")),
    "duration_s": 300.0, "assess_from_s": 60.0,
    "delay_factors": [0.5, 1.0, 2.0], "step": {"from": 0.7, "to": 1.05, "at_s": 60.0},
    "dip": {"factor": 0.7, "start_s": 60.0, "duration_s": 60.0}, "lost_fraction": 0.125,
    "map_delays_s": list(np.geomspace(0.1, 8.0, 15)), "map_gain_factors": list(np.geomspace(0.25, 16.0, 15))},
    quick={"duration_s": 200.0, "map_delays_s": list(np.geomspace(0.1, 8.0, 9)),
           "map_gain_factors": list(np.geomspace(0.25, 16.0, 9))})


def _assess_ready(resp, start_s: float):
    x = resp.sampled("ready", ASSESS_DT, start_s)
    return assess(x, ASSESS_DT, min_amplitude=MIN_AMPLITUDE)


def _agreement(predicted: float, simulated: float | None, what: str) -> str:
    """How a prediction compares with the simulation, in words from the numbers."""
    if simulated is None or not np.isfinite(simulated):
        return f"the simulation shows no sustained oscillation, so the predicted {what} is not confirmed"
    err = predicted / simulated - 1.0
    return f"{what} error {100 * err:+.1f} %"


def _naive_cost_sentence(n: dict, s: dict) -> str:
    """What the naive loop costs, decided from its figures against the smoothed loop's."""
    starving = n["decode_utilization"] < s["decode_utilization"] - 0.005
    swing = n.get("admission_swing_cv") or 0.0
    parts = [f"Its admission rate swings with a coefficient of variation of {swing:.2f}"
             + (" (fill arrives in bursts)" if swing > 0.1 else "")]
    if starving:
        parts.append(f"decode starves: utilisation {n['decode_utilization']:.3f} vs {s['decode_utilization']:.3f} "
                     "under smoothed admission")
    else:
        parts.append(f"decode does not starve (utilisation {n['decode_utilization']:.3f} vs "
                     f"{s['decode_utilization']:.3f} smoothed)")
    if n["backlog_p99"] > 1.5 * s["backlog_p99"]:
        parts.append(f"the backlog p99 is {n['backlog_p99']:.0f} vs {s['backlog_p99']:.0f}")
    return "; ".join(parts) + "."


def _loop_summary(resp, start_s: float) -> dict[str, Any]:
    """Detector indices and plant figures over the assessment window [start_s, end]."""
    rep = _assess_ready(resp, start_s)
    w = resp.window(start_s)
    ready = resp.column("ready")[w]
    adm = resp.column("admitted_rate")[w]
    return {
        "oscillating": rep.oscillating, "thornhill_r": rep.thornhill_r, "decay_ratio": rep.decay_ratio,
        "forsman_h": rep.forsman_h, "spectral_peak_fraction": rep.spectral_peak_fraction,
        "hagglund_alarm": rep.hagglund_alarm, "verdict_reason": rep.reason,
        "period_s": rep.period_s if rep.oscillating else None,
        "amplitude": float((ready.max() - ready.min()) / 2.0),
        "harmonic_amplitude": rep.harmonic_amplitude if rep.oscillating else None,
        "ready_mean": float(ready.mean()), "ready_min": float(ready.min()), "ready_max": float(ready.max()),
        "decode_utilization": float(resp.column("decode_utilization")[w].mean()),
        "backlog_p99": float(np.percentile(resp.column("backlog")[w], 99)),
        "admission_swing_cv": float(adm.std() / adm.mean()) if adm.mean() > 0 else None,
        "shed": float(resp.column("rejected")[-1]),
        "conservation_residual": resp.metrics["conservation_residual"],
    }


def _simulate(plant: FluidPlant, controller, sim: LoopScenario, ready0: float, backlog0_s: float = 5.0,
              **over):
    sim = dataclasses.replace(sim, **over)
    x0 = plant.initial_state(ready0, backlog0_s * plant.decode_capacity)
    return FluidLoopPlant(plant).run(sim, [controller], x0=x0)


@dataclasses.dataclass(frozen=True)
class _Loops:
    """The study's two shipped scenarios and what every section reads off them."""

    naive_sc: Any
    smooth_sc: Any
    plant: FluidPlant
    sim: LoopScenario
    assess_from_s: float

    @property
    def c(self) -> float:
        return self.plant.decode_capacity

    @property
    def naive(self) -> CompletionTriggeredAdmission:
        return self.naive_sc.controller

    @property
    def smoothed(self) -> SmoothedAdmission:
        return self.smooth_sc.controller

    @property
    def target(self) -> float:
        return self.smoothed.target_ready


def _loops(cfg) -> _Loops:
    naive_sc, smooth_sc = load_scenario(cfg["naive_scenario"]), load_scenario(cfg["smoothed_scenario"])
    sim = dataclasses.replace(smooth_sc.simulation, duration_s=cfg["duration_s"])
    return _Loops(naive_sc, smooth_sc, smooth_sc.plant, sim, cfg["assess_from_s"])


def _unpack(lp: _Loops):
    return lp.naive_sc, lp.smooth_sc, lp.plant, lp.c, lp.sim, lp.assess_from_s, lp.naive, lp.smoothed, lp.target


def _naive_section(lp: _Loops) -> dict[str, Any]:
    """(a) The naive loop's limit cycle against the describing function's prediction."""
    naive_sc, smooth_sc, plant, c, sim, t_a, naive, smoothed, target = _unpack(lp)
    r_naive = _simulate(naive_sc.plant, naive, sim, ready0=naive.low_water)
    naive_m = _loop_summary(r_naive, t_a)
    naive_loop, lc = naive_limit_cycle(naive_sc.plant, naive)
    _, lc_pade = naive_limit_cycle(naive_sc.plant, naive, method="pade")
    naive_m.update({"predicted_period_s": lc.period_s, "predicted_amplitude": lc.amplitude,
                    "predicted_period_pade_s": lc_pade.period_s, "predicted_amplitude_pade": lc_pade.amplitude,
                    "relay_amplitude_per_s": naive.relay_amplitude(c), "loop_delay_s": naive_loop.delay,
                    "controller": naive.params()})
    if naive_m["period_s"]:
        naive_m["period_error"] = naive_m["period_s"] / lc.period_s - 1.0
        naive_m["amplitude_error"] = naive_m["harmonic_amplitude"] / lc.amplitude - 1.0

    return {"metrics": naive_m, "run": r_naive, "loop": naive_loop, "cycle": lc, "cycle_pade": lc_pade}


def _smoothed_section(lp: _Loops, cfg, report: StudyReport, naive: dict[str, Any]) -> dict[str, Any]:
    """(b) The smoothed loop at 0.5x, 1x and 2x the delay, and the threshold baseline."""
    naive_sc, smooth_sc, plant, c, sim, t_a, naive_ctrl, smoothed, target = _unpack(lp)
    r_naive, naive_m = naive["run"], naive["metrics"]
    r_smooth = _simulate(plant, smoothed, sim, ready0=target)
    smooth_m = _loop_summary(r_smooth, t_a)
    nominal = stability_margins(admission_loop(plant, smoothed))
    smooth_m.update({"stable": nominal.stable, "open_loop_rhp_poles": nominal.open_loop_rhp_poles,
                     "closed_loop_rhp_poles": nominal.closed_loop_rhp_poles,
                     "gain_margin": nominal.gain_margin, "lower_gain_margin": nominal.lower_gain_margin,
                     "phase_margin_deg": nominal.phase_margin_deg,
                     "delay_margin_s": nominal.delay_margin_s, "ms": nominal.ms,
                     "crossover_rad_s": nominal.crossover_rad_s, "target_ready": target,
                     "controller": smoothed.params(), "tuning": smooth_sc.tuning.to_dict()})
    pade = stability_margins(admission_loop(plant, smoothed), "pade")
    smooth_m["pade_check"] = {"method": pade.method, "phase_margin_deg": pade.phase_margin_deg,
                              "gain_margin": pade.gain_margin, "delay_margin_s": pade.delay_margin_s}
    robustness, rob_runs = {}, {}
    for f in cfg["delay_factors"]:
        pl = FluidPlant(plant.params.scaled(delay_factor=f), plant.fill_workers, plant.decode_workers)
        rr = _simulate(pl, smoothed, sim, ready0=target)
        m = stability_margins(admission_loop(plant, smoothed, delay_factor=f))
        robustness[f"{f:g}x"] = {**_loop_summary(rr, t_a), "stable": m.stable, "gain_margin": m.gain_margin,
                                 "phase_margin_deg": m.phase_margin_deg, "delay_margin_s": m.delay_margin_s}
        rob_runs[f"smoothed, delay x{f:g}"] = rr
    r_thr = _simulate(plant, ThresholdAdmission(), sim, ready0=target)
    threshold_m = _loop_summary(r_thr, t_a)

    fig = Figure(figsize=(11, 7), layout="constrained")
    ax = fig.subplots(2, 1, sharex=True)
    loop_response_plot({"naive (completion-triggered)": r_naive, "threshold on/off": r_thr,
                        "smoothed (auto-tuned PI)": r_smooth}, "ready", target=target, ax=ax[0],
                       ylabel="ready buffer (requests)")
    ax[0].set_title(f"Section 18 on the fluid plant: DeepSeek-V3, {plant.fill_workers:g} fill + "
                    f"{plant.decode_workers:g} decode workers (8xH200 each), demand = decode capacity")
    loop_response_plot({"naive": r_naive, "threshold": r_thr, "smoothed": r_smooth}, "admitted_rate",
                       ax=ax[1], ylabel="admission (requests/s)")
    for a in ax:
        a.set_xlim(t_a, t_a + 40)
    def verdict(m: dict) -> str:
        return (f"cycles (period {m['period_s']:.2f} s, +/-{m['amplitude']:.0f})" if m["oscillating"]
                else f"does not oscillate (+/-{m['amplitude']:.1f})")

    report.save_figure(fig, "limit_cycle.png",
                       f"Ready buffer and admission rate, 40 s window: the naive loop {verdict(naive_m)}, the "
                       f"threshold rule {verdict(threshold_m)}, the smoothed loop {verdict(smooth_m)} around its "
                       f"target of {target:.0f}.")
    fig = Figure(figsize=(10, 4.5), layout="constrained")
    loop_response_plot(rob_runs, "ready", target=target, ax=fig.subplots(), ylabel="ready buffer (requests)")
    report.save_figure(fig, "delay_robustness.png",
                       "Smoothed loop tuned once at the nominal delay, run at 0.5x, 1x and 2x the delay.")

    return {"metrics": smooth_m, "nominal": nominal, "robustness": robustness, "threshold": threshold_m}


def _responses_section(lp: _Loops, cfg, report: StudyReport) -> dict[str, Any]:
    """(c) The step and disturbance responses."""
    naive_sc, smooth_sc, plant, c, sim, t_a, naive, smoothed, target = _unpack(lp)
    step = cfg["step"]
    step_sim = dataclasses.replace(sim, demand=step["from"] * c,
                                   disturbances=(DemandStep(step["at_s"], step["to"] / step["from"]),))
    x_low = plant.initial_state(0.0, 0.0)
    x_low[3] = step["from"] * plant.params.decode_slots(plant.decode_workers)
    x_low[1] = step["from"] * c * plant.params.fill_to_ready_s
    x_low[4] = x_low[1] + x_low[3]
    step_runs = {name: FluidLoopPlant(plant).run(step_sim, [ctrl], x0=x_low)
                 for name, ctrl in (("smoothed", smoothed), ("naive", naive))}
    step_m = {name: {**step_metrics(r.time, r.column("ready"), t0=step["at_s"], initial=0.0, final=target,
                                    band=SETTLE_BAND),
                     **_loop_summary(r, step["at_s"] + 60.0)} for name, r in step_runs.items()}
    dip = cfg["dip"]
    dist_sims = {
        "decode_rate_dip": dataclasses.replace(sim, disturbances=(DecodeRateDip(dip["start_s"], dip["duration_s"],
                                                                                dip["factor"]),)),
        "decode_workers_lost": dataclasses.replace(sim, disturbances=(DecodeWorkersLost(dip["start_s"],
                                                                                        cfg["lost_fraction"]),)),
    }
    dist_m, dist_runs = {}, {}
    for name, dsim in dist_sims.items():
        r = _simulate(plant, smoothed, dsim, ready0=target)
        end = dip["start_s"] + (dip["duration_s"] if name == "decode_rate_dip" else 0.0)
        dist_m[name] = {**disturbance_metrics(r.time, r.column("ready"), t_start=dip["start_s"], t_end=end,
                                              target=target, band=SETTLE_BAND * target),
                        "min_decode_utilization": float(r.column("decode_utilization")[r.window(dip["start_s"])].min()),
                        "shed": float(r.column("rejected")[-1]), "requeued": float(r.column("requeued")[-1]),
                        **{k: v for k, v in _loop_summary(r, end + 20.0).items()
                           if k in ("oscillating", "thornhill_r", "decay_ratio")}}
        dist_runs[name] = r
    fig = Figure(figsize=(11, 8), layout="constrained")
    ax = fig.subplots(3, 1)
    loop_response_plot(step_runs, "ready", target=target, events=[(step["at_s"], "+50 % demand")], ax=ax[0],
                       ylabel="ready (requests)")
    loop_response_plot({"decode rate -30 % for 60 s": dist_runs["decode_rate_dip"]}, "ready", target=target,
                       events=[(dip["start_s"], "dip"), (dip["start_s"] + dip["duration_s"], "end")], ax=ax[1],
                       ylabel="ready (requests)")
    loop_response_plot({"1/8 of decode workers lost": dist_runs["decode_workers_lost"]}, "ready", target=target,
                       events=[(dip["start_s"], "loss")], ax=ax[2], ylabel="ready (requests)")
    report.save_figure(fig, "step_and_disturbances.png",
                       "Smoothed loop: +50 % demand step (naive for contrast), a 30 % decode-rate dip for "
                       "60 s, and the loss of 1/8 of decode workers (their sequences re-queued).")

    return {"step": step_m, "disturbances": dist_m}


def _nyquist_section(lp: _Loops, report: StudyReport, naive_out: dict[str, Any], nominal) -> dict[str, Any]:
    """(d) Nyquist curves with the describing-function locus."""
    naive_sc, smooth_sc, plant, c, sim, t_a, naive, smoothed, target = _unpack(lp)
    naive_loop, lc = naive_out["loop"], naive_out["cycle"]
    amps = np.geomspace(1e-3, 1e4, 400) * naive.relay_amplitude(c)
    locus = -1.0 / np.array([naive.describing_nonlinearity(c).describing_function(a) for a in amps])
    point = -1.0 / naive.describing_nonlinearity(c).describing_function(lc.amplitude)
    fig = Figure(figsize=(11, 5), layout="constrained")
    ax = fig.subplots(1, 2)
    nyquist_plot({"naive: e^{-Ls}/s": naive_loop}, df_locus={"-1/N(A), relay": (locus, point)},
                 limit=max(3.0, 1.5 * abs(point)), ax=ax[0])
    ax[0].set_title(f"naive: limit cycle predicted at A={lc.amplitude:.0f}, T={lc.period_s:.2f} s")
    worst = smooth_sc.tuning.worst_envelope_point
    nyquist_plot({"smoothed, nominal": admission_loop(plant, smoothed),
                  f"smoothed, worst envelope point (delay x{worst['delay_factor']:g}, rate x{worst['service_rate_factor']:g})":
                      admission_loop(plant, smoothed, delay_factor=worst["delay_factor"],
                                     service_rate_factor=worst["service_rate_factor"])},
                 ms_circle=2.0, limit=2.5, ax=ax[1])
    ax[1].set_title(f"smoothed: GM {nominal.gain_margin:.2f}, PM {nominal.phase_margin_deg:.0f} deg, "
                    f"DM {nominal.delay_margin_s:.2f} s")
    report.save_figure(fig, "nyquist.png",
                       "Nyquist curves on the exact delay. Left: the naive loop and the relay's -1/N(A) locus ("
                       + (f"they cross: a limit cycle at A = {lc.amplitude:.0f}, T = {lc.period_s:.2f} s" if lc
                          else "no crossing: no limit cycle predicted")
                       + f"). Right: the smoothed loop's closest approach to -1 is {1.0 / nominal.ms:.2f} "
                       f"(1/Ms) nominally.")

    return {"worst": worst}


def _stability_map_section(lp: _Loops, cfg, report: StudyReport, smooth_m: dict[str, Any]) -> dict[str, Any]:
    """(e) The stability map over delay x controller gain, confirmed in the time domain."""
    naive_sc, smooth_sc, plant, c, sim, t_a, naive, smoothed, target = _unpack(lp)
    base_P, base_theta = plant.ready_buffer_tf()
    C, F = smoothed.transfer_function(), smoothed.measurement_filter()

    def make_loop(delay_s, gain):
        return DelayedLoop(C * F * base_P * gain, base_theta + delay_s + smoothed.sample_period / 2.0)

    smap = stability_map(make_loop, "measurement_delay_s", cfg["map_delays_s"], "gain_factor", cfg["map_gain_factors"])
    report.save_table(smap, "stability_map.csv")
    ax = stability_map_plot(smap, "measurement_delay_s", "gain_factor", "phase_margin_deg",
                            marker=(plant.params.measurement_delay_s, 1.0), floor=45.0)
    ax.set_title("Smoothed loop: phase margin over measurement delay x PI gain")
    report.save_figure(ax.figure, "stability_map.png",
                       "Phase margin (exact delay) over measurement delay and a multiplier on the PI "
                       "gain; crosses are unstable, the white contour is PM = 45 deg, the star the design.")
    # Confirm the map in the time domain: at the design delay, the first unstable gain above the
    # design. The map is of the linear loop, so the confirming run lifts the slew limit (a
    # nonlinearity the linear analysis does not model, which can hide a linear instability).
    design_delay = plant.params.measurement_delay_s
    grid_delay = min(cfg["map_delays_s"], key=lambda d: abs(np.log(d / design_delay)))
    col = smap[(smap["measurement_delay_s"] == grid_delay) & (smap["gain_factor"] >= 1.0)]
    # clearly unstable (PM <= -5 deg), so growth is visible within the run
    unstable = col[~col["stable"] & (col["phase_margin_deg"] <= -5.0)].sort_values("gain_factor").head(1)
    confirm = {}
    if len(unstable):
        ug = float(unstable["gain_factor"].iloc[0])
        hot_ctrl = SmoothedAdmission(target, dataclasses.replace(smoothed.gains, kc=smoothed.gains.kc * ug),
                                     filter_tau=smoothed.filter_tau, service_filter_tau=smoothed.service_filter_tau,
                                     sample_period=smoothed.sample_period, backlog_bound=smoothed.backlog_bound)
        pl = FluidPlant(dataclasses.replace(plant.params, measurement_delay_s=grid_delay), plant.fill_workers,
                        plant.decode_workers)
        ru = _simulate(pl, hot_ctrl, sim, ready0=0.8 * target)  # start 20 % off target
        keep = ("oscillating", "thornhill_r", "decay_ratio", "period_s", "amplitude")
        confirm = {"unstable_point": {"measurement_delay_s": grid_delay, "gain_factor": ug,
                                      "phase_margin_deg": float(unstable["phase_margin_deg"].iloc[0]),
                                      **{k: v for k, v in _loop_summary(ru, t_a).items() if k in keep}},
                   "design_point": {"measurement_delay_s": design_delay, "gain_factor": 1.0,
                                    "oscillating": smooth_m["oscillating"]}}

    return {"map": smap, "confirmation": confirm}


def _answers(report: StudyReport, naive_m: dict, smooth_m: dict, threshold_m: dict, naive_loop, lc) -> None:
    """The study's headlines, loop verdicts and recommended change, from the sections' numbers."""
    n, s = naive_m, smooth_m
    report.headline("naive loop", "oscillates" if n["oscillating"] else "quiet",
                    note=f"period {n['period_s'] or float('nan'):.2f} s vs {lc.period_s:.2f} s predicted")
    report.headline("smoothed loop", "oscillates" if s["oscillating"] else "quiet",
                    note=f"ready swing +/-{s['amplitude']:.1f} requests")
    report.loop("admission, naive (completion-triggered)", n["oscillating"],
                detail=f"limit cycle of period {n['period_s'] or float('nan'):.2f} s simulated, {lc.period_s:.2f} s "
                       "predicted by the describing function" if n["oscillating"] else "no oscillation detected")
    report.loop("admission, threshold on/off", threshold_m["oscillating"],
                detail=(f"period {threshold_m['period_s']:.2f} s" if threshold_m["oscillating"] and threshold_m["period_s"]
                        else "oscillating" if threshold_m["oscillating"] else "no oscillation detected"))
    report.loop("admission, smoothed (SIMC-tuned)", s["oscillating"], gain_margin=s["gain_margin"],
                phase_margin_deg=s["phase_margin_deg"], delay_margin_s=s["delay_margin_s"],
                detail=f"{'stable' if s['stable'] else 'UNSTABLE'} by the Nyquist count on the exact delay; ready "
                       f"swing +/-{s['amplitude']:.1f} requests")
    report.answer("change", f"Replace completion-triggered admission by the SIMC-tuned smoothed admission: the naive "
                  f"loop {'cycles with period %.2f s' % n['period_s'] if n['oscillating'] and n['period_s'] else 'does not settle'}"
                  f", the smoothed one {'oscillates too' if s['oscillating'] else 'holds the ready buffer'} with GM "
                  f"{s['gain_margin']:.2f}, PM {s['phase_margin_deg']:.0f} deg and a {s['delay_margin_s']:.2f} s delay "
                  f"margin.")
    report.headline("phase margin", s["phase_margin_deg"], "deg", f"gain margin {s['gain_margin']:.2f}")
    report.headline("delay margin", s["delay_margin_s"], "s", f"loop delay {naive_loop.delay:.2f} s")


def _summary(lp: _Loops, naive_m: dict, smooth_m: dict, threshold_m: dict, lc, lc_pade, worst: dict,
             robustness: dict, step_m: dict, dist_m: dict, smap, confirm: dict) -> list[str]:
    """The summary's table and one paragraph per section, from the sections' numbers."""
    plant, c, smooth_sc = lp.plant, lp.c, lp.smooth_sc
    n, s = naive_m, smooth_m
    lines = [
        f"Plant: DeepSeek-V3 on 8xH200 workers, {plant.fill_workers:g} fill + {plant.decode_workers:g} decode; "
        f"decode capacity {c:.0f} requests/s, fill-to-ready delay {plant.params.fill_to_ready_s * 1e3:.0f} ms, "
        f"measurement delay {plant.params.measurement_delay_s:g} s, mean decode {plant.params.mean_decode_s():.1f} s; "
        "demand = decode capacity with 5 % noise. (r: Thornhill regularity, R: Miao-Seborg decay ratio; "
        "'-' where the signal has no oscillation to measure.)",
        "",
        "| loop | oscillating | r | R | period (s) | ready swing (+/-) | decode util | backlog p99 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    def fmt(v, spec=".2f"):
        return "-" if v is None or v != v else format(v, spec)

    for name, m in (("naive", n), ("threshold", threshold_m), ("smoothed", s)):
        lines.append(f"| {name} | {m['oscillating']} | {fmt(m['thornhill_r'])} | {fmt(m['decay_ratio'])} | "
                     f"{fmt(m['period_s'])} | {m['amplitude']:.1f} | {m['decode_utilization']:.4f} | "
                     f"{m['backlog_p99']:.0f} |")
    lines += [
        "",
        f"* **(a) Naive limit cycle**: describing function predicts T = {lc.period_s:.2f} s and first-harmonic "
        f"amplitude {lc.amplitude:.1f} requests (Pade {lc_pade.method}: {lc_pade.period_s:.2f} s); simulation gives "
        f"T = {n['period_s'] or float('nan'):.2f} s, first harmonic {n['harmonic_amplitude'] or float('nan'):.1f} "
        f"({_agreement(lc.period_s, n['period_s'], 'period')}). "
        + _naive_cost_sentence(n, s),
        f"* **(b) Smoothed loop**: {'stable' if s['stable'] else 'UNSTABLE'} by the Nyquist count on the exact delay "
        f"({s['open_loop_rhp_poles']} open-loop and {s['closed_loop_rhp_poles']} closed-loop right-half-plane poles); "
        f"GM {s['gain_margin']:.2f}, PM {s['phase_margin_deg']:.1f} deg, delay margin "
        f"{s['delay_margin_s']:.2f} s, Ms {s['ms']:.2f} (exact delay; {s['pade_check']['method']} gives PM "
        f"{s['pade_check']['phase_margin_deg']:.1f} deg). Tuned by SIMC with tau_c = "
        f"{smooth_sc.tuning.tau_c_over_theta:g} theta so the floors (GM >= 2, PM >= 45 deg) hold over the envelope "
        f"(worst point PM {worst['phase_margin_deg']:.1f} deg). Oscillating at 0.5x / 1x / 2x delay: "
        + " / ".join(str(robustness[k]["oscillating"]) for k in robustness) + ".",
        f"* **(c) Responses**: +50 % demand step: ready overshoot {step_m['smoothed']['overshoot_pct']:.1f} %, "
        f"settling {step_m['smoothed']['settling_time_s']:.1f} s (naive: oscillating = "
        f"{step_m['naive']['oscillating']}). Decode dip -30 % for 60 s: peak deviation "
        f"{dist_m['decode_rate_dip']['peak_deviation']:+.0f} requests, settles {dist_m['decode_rate_dip']['settling_time_s']:.1f} s "
        f"after the dip. Loss of 1/8 decode workers: peak deviation {dist_m['decode_workers_lost']['peak_deviation']:+.0f}, "
        f"{dist_m['decode_workers_lost']['requeued']:.0f} sequences re-queued, settles in "
        f"{dist_m['decode_workers_lost']['settling_time_s']:.1f} s.",
        f"* **(e) Stability map**: {100 * smap['stable'].mean():.0f} % of {len(smap)} (delay, gain) points stable; "
        + (f"at the design delay the first clearly unstable gain (PM <= -5 deg) is "
           f"x{confirm['unstable_point']['gain_factor']:.2f}; "
           f"simulated there (slew limit lifted) it oscillates: {confirm['unstable_point']['oscillating']} "
           f"(period {confirm['unstable_point']['period_s'] or float('nan'):.2f} s)."
           if confirm else "no unstable gain at the design delay in the grid."),
        "",
        "Detector thresholds: Thornhill r > 1, Miao-Seborg R > 0.5, Forsman-Stattin h > 0.4 (see "
        "`controllers/oscillation.py` for sources and the verdict rule).",
    ]
    return lines


def run(out_dir: str | Path, quick: bool = False, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the study: resolve the config, then sections (a)-(e), each returning its metrics.

    Parameters
    ----------
    out_dir : str or Path
        Folder for figures, tables, ``metrics.json`` and ``summary.md``.
    quick : bool
        The quick variant (shorter runs, a coarser stability map).
    config : dict, optional
        Overrides of :data:`CONFIG`'s keys; unknown keys are errors.

    Returns
    -------
    dict
        The metrics written to ``metrics.json``.
    """
    cfg = resolve_study_config(CONFIG, config, quick=quick)
    report = StudyReport("feedback-oscillation", Path(out_dir), cfg)
    lp = _loops(cfg)
    naive_sc, smooth_sc, plant, c, sim, t_a, naive, smoothed, target = _unpack(lp)
    a = _naive_section(lp)
    naive_m, naive_loop, lc, lc_pade = a["metrics"], a["loop"], a["cycle"], a["cycle_pade"]
    b = _smoothed_section(lp, cfg, report, a)
    smooth_m, nominal, robustness, threshold_m = b["metrics"], b["nominal"], b["robustness"], b["threshold"]
    resp = _responses_section(lp, cfg, report)
    step_m, dist_m = resp["step"], resp["disturbances"]
    worst = _nyquist_section(lp, report, a, nominal)["worst"]
    e = _stability_map_section(lp, cfg, report, smooth_m)
    smap, confirm = e["map"], e["confirmation"]

    metrics = {
        "naive": naive_m,
        "smoothed": smooth_m,
        "threshold": threshold_m,
        "delay_robustness": robustness,
        "step": step_m,
        "disturbances": dist_m,
        "stability_map": {"points": len(smap), "stable_fraction": float(smap["stable"].mean()),
                          "confirmation": confirm},
        "plant": {"decode_capacity_per_s": c, "fill_capacity_per_s": plant.fill_capacity,
                  "fill_to_ready_s": plant.params.fill_to_ready_s,
                  "measurement_delay_s": plant.params.measurement_delay_s,
                  "mean_decode_s": plant.params.mean_decode_s(),
                  "decode_slots": plant.params.decode_slots(plant.decode_workers),
                  "params": {k: v for k, v in dataclasses.asdict(plant.params).items()}},
    }
    _answers(report, naive_m, smooth_m, threshold_m, naive_loop, lc)
    lines = _summary(lp, naive_m, smooth_m, threshold_m, lc, lc_pade, worst, robustness, step_m, dist_m, smap,
                     confirm)
    return report.finish(metrics, lines)
