"""The stack certificate (``tokenfactory certify``): every layer's gain, phase and delay margins
over the envelope (delays, service rates, demand level; start-up times for the reconfiguration
layer) with the binding point named; the separation of each adjacent pair of layers
(:mod:`tokenfactory.controllers.separation`: inner closed-loop bandwidth, outer crossover, ratio,
the outer loop's PM with the real inner loop); the describing-function check of every relay or
saturation in a loop (admission's rate clip, the reconfiguration layer's whole-worker hysteresis
relay); a verdict: passed when every floor holds."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pandas as pd

from tokenfactory.controllers.separation import CascadePair
from tokenfactory.core.validation import ConfigError, resolve_config
from tokenfactory.registry.stack_layers import STACK_LAYERS, StackLayerConfig
from tokenfactory.stack.layer_certificates import CertificateDraft
from tokenfactory.stack.plant import gate_fraction, stack_plant, target_utilization
from tokenfactory.stack.stack_scenario import StackScenario

__all__ = ["Certificate", "certify", "passing_value", "KNOB_FACTORS"]


@dataclass
class Certificate:
    """The stack certificate: per-layer margins over the envelope, separations, describing-function
    checks, failures (each naming its layer) and the verdict.

    Parameters
    ----------
    scenario : str
        The scenario's name.
    layers : dict
        Per layer: its worst point over the envelope (margins) and every point, or what a static
        or feed-forward layer is.
    separation : list of CascadePair
        Each adjacent pair of layers, outer first.
    describing_function : list of dict
        The describing-function check of every relay or saturation.
    failures : list of dict
        ``{"layer", "check", "detail"}`` for every floor that fails (empty: passed).
    binding : dict
        The layer and envelope point with the least margin.
    """

    scenario: str
    layers: dict[str, dict]
    separation: list[CascadePair]
    describing_function: list[dict]
    failures: list[dict]
    binding: dict

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict:
        return {"scenario": self.scenario, "passed": self.passed, "layers": self.layers,
                "separation": [s.to_dict() for s in self.separation],
                "separation_rows": self.separation_rows(),
                "describing_function": self.describing_function, "failures": self.failures,
                "binding": self.binding}

    def separation_rows(self) -> list[dict]:
        return [{"outer": s.outer, "inner": s.inner, "inner_bandwidth_rad_s": s.inner_bandwidth_rad_s,
                 "outer_crossover_rad_s": s.outer_crossover_rad_s, "ratio": s.ratio,
                 "pm_ideal_deg": s.ideal.phase_margin_deg if s.ideal else None,
                 "pm_real_deg": s.real.phase_margin_deg if s.real else None,
                 "pm_loss_deg": s.pm_loss_deg if s.ideal else None,
                 "first_order_pm_loss_deg": s.first_order_pm_loss_deg, "note": s.note} for s in self.separation]

    def to_pandas(self) -> pd.DataFrame:
        rows = []
        for layer, d in self.layers.items():
            for r in d.get("points", []):
                rows.append({"layer": layer, **r})
        return pd.DataFrame(rows)


def certify(sc: StackScenario, passing_values: bool = True) -> Certificate:
    """Margins, separations, describing-function checks and the verdict of a stack scenario: every
    layer's certificate loops (its kind's, looked up in the registry) fastest layer first, then the
    separation and describing-function floors. A failure of a layer with knobs (its kind's
    ``knobs``) names the setting of that layer and the value that passes (:func:`passing_value`).

    Parameters
    ----------
    sc : StackScenario
        The scenario (its envelope and certificate floors).
    passing_values : bool
        Search a passing value for each failure (it re-runs the failed check per candidate).

    Returns
    -------
    Certificate
        ``passed`` is True when every floor holds; each failure names its layer and the binding point.
    """
    d = _check_layers(sc, STACK_LAYERS)
    if passing_values:
        memo: dict = {}
        for f in list(d.failures):
            fix = passing_value(sc, f, d.failures, d, memo)
            if fix is not None:
                f["passing_value"] = fix
                f["detail"] += f"; {fix['setting']} {fix['from']:g} -> {fix['to']:g} passes"
            elif _searched(sc.layers.get(f["layer"])):
                f["detail"] += (f"; no single change of layers.{f['layer']}'s {', '.join(_searched(sc.layers[f['layer']]))} "
                                f"(x{min(KNOB_FACTORS):g} to x{max(KNOB_FACTORS):g}) passes")
    scored = [(name, layer["worst"]) for name, layer in d.layers.items() if "worst" in layer]
    bname, bpoint = min(scored, key=lambda x: x[1]["score"])
    binding = {"layer": bname, **bpoint}
    return Certificate(sc.name, d.layers, d.separation, d.describing_function, d.failures, binding)


#: multiples of a setting's value the passing-value search tries, nearest first
KNOB_FACTORS = (1.25, 0.8, 1.5, 2.0 / 3.0, 2.0, 0.5, 3.0, 1.0 / 3.0, 4.0, 0.25, 6.0, 8.0, 10.0)


def _searched(cfg: StackLayerConfig | None) -> list[str]:
    """The kind's knobs set to a number: what the passing-value search changes."""
    return [k for k in (cfg.knobs if cfg is not None else ())
            if isinstance(getattr(cfg, k), (int, float)) and not isinstance(getattr(cfg, k), bool)]


def _candidates(cfg: StackLayerConfig, where: str):
    """(knob, value) pairs over the kind's knobs, nearest change first; only knobs set to a number
    (a builder's default or an "auto" is not searched), each value within the knob's range."""
    for f in KNOB_FACTORS:
        for knob in _searched(cfg):
            v0 = getattr(cfg, knob)
            v = float(f"{v0 * f:.3g}")
            if isinstance(v0, int):
                v = int(round(v))
            if v == v0:
                continue
            try:
                resolve_config(type(cfg), {knob: v}, where)   # within the setting's range
            except ConfigError:
                continue
            yield knob, v0, v


def passing_value(sc: StackScenario, failure: dict, failures: list[dict], base: CertificateDraft | None = None,
                  memo: dict | None = None) -> dict | None:
    """The nearest single-setting change of the failing layer that passes its failed check: each
    candidate (:data:`KNOB_FACTORS` x the kind's ``knobs``) re-runs that layer's certificate loops
    (and those of the layers below it when the change reaches them) and passes when the failed
    check is gone and no check of those layers fails that did not before.

    Parameters
    ----------
    sc : StackScenario
        The scenario.
    failure : dict
        One failure of its certificate (``layer``, ``check``).
    failures : list of dict
        All its failures.
    base : CertificateDraft, optional
        The scenario's checked layers (what a change that does not reach the layers below reuses).
    memo : dict, optional
        Failed checks per candidate, shared between the failures of one certificate.

    Returns
    -------
    dict or None
        ``{"setting": "layers.L.KNOB", "from": v0, "to": v}``, or None when no candidate passes
        (or the layer has no knobs).
    """
    layer = failure["layer"]
    cfg = sc.layers.get(layer)
    if not _searched(cfg):
        return None
    base = base if base is not None else _check_layers(sc, STACK_LAYERS)
    memo = memo if memo is not None else {}
    upto = STACK_LAYERS[: STACK_LAYERS.index(layer) + 1]
    before = {(f["layer"], f["check"]) for f in failures if f["layer"] in upto}
    for knob, v0, v in _candidates(cfg, f"layers.{layer}"):
        if (layer, knob, v) not in memo:
            cand = dataclasses.replace(sc, layers={**sc.layers, layer: dataclasses.replace(cfg, **{knob: v})})
            try:
                memo[layer, knob, v] = _recheck(cand, layer, base)
            except ConfigError:
                memo[layer, knob, v] = None
        after = memo[layer, knob, v]
        if after is not None and (layer, failure["check"]) not in after and after <= before:
            return {"setting": f"layers.{layer}.{knob}", "from": v0, "to": v}
    return None


def _reach_below(sc: StackScenario) -> tuple:
    """What the layers below read of a layer's settings: the gated plant (its slot limit follows the
    gate's share of the TPOT SLO), that share, and the utilisation the pools are sized at (the
    plant derivations of :mod:`tokenfactory.stack.plant`; a certificate loop reads another layer's
    settings through nothing else)."""
    plant = stack_plant(sc)
    return plant.params, plant.fill_workers, plant.decode_workers, gate_fraction(sc), target_utilization(sc)


def _recheck(cand: StackScenario, layer: str, base: CertificateDraft) -> set[tuple[str, str]]:
    """The failed checks of ``layer`` and those below it in the candidate scenario: when the change
    does not reach the layers below, only ``layer``'s loops run on the base's loops below."""
    upto = STACK_LAYERS[: STACK_LAYERS.index(layer) + 1]
    if _reach_below(cand) != _reach_below(base.sc):
        return {(f["layer"], f["check"]) for f in _check_layers(cand, upto).failures}
    d = CertificateDraft(cand, base.plant, loops={la: base.loops[la] for la in upto[:-1] if la in base.loops})
    cand.layers[layer].certify(d)
    below = {(f["layer"], f["check"]) for f in base.failures if f["layer"] in upto[:-1]}
    return below | {(f["layer"], f["check"]) for f in d.failures + _floor_failures(cand, d)}


def _check_layers(sc: StackScenario, layers: tuple[str, ...]) -> CertificateDraft:
    """The certificate loops of ``layers`` (fastest first) and the floors of what they recorded."""
    d = CertificateDraft(sc, stack_plant(sc))
    for layer in layers:
        cfg = sc.layers.get(layer)
        if cfg is not None:
            d.loops[layer] = cfg.certify(d)
    d.failures += _floor_failures(sc, d)
    return d


def _floor_failures(sc: StackScenario, d: CertificateDraft) -> list[dict]:
    """The separation floors of every feedback pair and the describing-function checks."""
    out = []
    for s in d.separation:
        if s.ideal is None:
            continue
        if s.ratio < sc.min_separation:
            out.append({"layer": s.outer, "check": "separation",
                        "detail": f"{s.outer} crossover {s.outer_crossover_rad_s:.3g} rad/s is only "
                                  f"{s.ratio:.2f} x below {s.inner}'s bandwidth {s.inner_bandwidth_rad_s:.3g} "
                                  f"rad/s (needs >= {sc.min_separation:g})"})
        if s.pm_loss_deg > sc.max_pm_loss_deg:
            out.append({"layer": s.outer, "check": "pm_loss",
                        "detail": f"{s.inner}'s closed loop costs {s.outer} {s.pm_loss_deg:.1f} deg of phase "
                                  f"margin (allowed {sc.max_pm_loss_deg:g})"})
    for df in d.describing_function:
        if df["limit_cycle"]:
            out.append({"layer": df["layer"], "check": "describing_function",
                        "detail": f"{df['element']}: limit cycle predicted (period {df['period_s']:.0f} s)"})
    return out
