"""The project's margins against python-control's reference table.

The systems, reference values and tolerances are copied from python-control 0.10.2,
``control/tests/margin_test.py``: the ``tsys`` fixture (``stability_margins(sys)`` ->
(gm, pm, sm, wpc, wgc, wms) and ``returnall=True`` lists) and the tolerances of
``test_margin_sys`` (atol 1.5e-3 on gm, pm, wpc, wgc) and ``test_stability_margins``
(atol 1.5e-2 on everything). Definitions that differ (see ``controllers/stability.py``):
python-control's sm is the smallest *interior* local minimum of |1 + L| (inf if none), ours is
1/Ms with Ms = sup |S| including w -> 0 and inf, so where sm = inf we check that our peak is at a
limit (ms_frequency 0 or inf) instead.
"""

import math

import control
import numpy as np
import pytest
from numpy import inf, nan

from tokenfactory import ConfigError
from tokenfactory.controllers import DelayedLoop, stability_margins

s = control.tf("s")

# name, system, (gm, pm, sm, wpc, wgc, wms), (gms, pms, sms, wpcs, wgcs, wmss)  -- margin_test.py tsys
TSYS = [
    ("tf1", control.tf([1, 2], [1, 2, 3]),
     (inf, inf, inf, nan, nan, nan),
     ([], [], [], [], [], [])),
    ("tf2", control.tf([1], [1, 2, 3, 4]),
     (2., inf, 0.4170, 1.7321, nan, 1.6620),
     ([2.], [], [1.2500, 0.4170], [1.7321], [], [0.1690, 1.6620])),
    ("ss-unstable", control.ss([[1., 4.], [3., 2.]], [[1.], [-4.]], [[1., 0.]], [[0.]]),
     (inf, 147.0743, inf, nan, 2.5483, nan),
     ([], [147.0743], [], [], [2.5483], [])),
    ("three-crossovers", (8.75 * (4 * s**2 + 0.4 * s + 1)) / ((100 * s + 1) * (s**2 + 0.22 * s + 1))
     / (s**2 / 10.**2 + 2 * 0.04 * s / 10. + 1),
     (2.2716, 97.5941, 0.5591, 10.0053, 0.0850, 9.9918),
     ([2.2716], [97.5941, -157.7844, 134.7359], [1.0381, 0.5591], [10.0053], [0.0850, 0.9373, 1.0919],
      [0.4064, 9.9918])),
    ("first-order", 1 / (1 + s),
     (inf, inf, inf, nan, nan, nan),
     ([], [], [], [], [], [])),
    ("biproper", 3 * (10 + s) / (2 + s),
     (inf, inf, inf, nan, nan, nan),
     ([], [], [], [], [], [])),
    ("nonminimum-phase", 0.01 * (10 - s) / (2 + s) / (1 + s),
     (300.0, inf, 0.9917, 5.6569, nan, 2.3171),
     ([300.0], [], [0.9917], [5.6569], [], [2.3171])),
]
ATOL_MARGIN = 1.5e-3   # test_margin_sys
ATOL_ALL = 1.5e-2      # test_stability_margins

# The closed-loop verdicts (from the closed-loop poles; python-control reports none).
STABLE = {"tf1": True, "tf2": True, "ss-unstable": False, "three-crossovers": True, "first-order": True,
          "biproper": True, "nonminimum-phase": True}


def _ours(m):
    """Our numbers in python-control's (gm, pm, sm, wpc, wgc, wms) shape."""
    gm_rows = [c for c in m.phase_crossings if math.isclose(c.gain_factor, m.gain_margin, rel_tol=1e-9)]
    wpc = gm_rows[0].frequency_rad_s if gm_rows else nan
    pm_rows = [c for c in m.gain_crossings if c.phase_margin_deg == m.phase_margin_deg]
    wgc = pm_rows[0].frequency_rad_s if pm_rows else nan
    interior = 0 < m.ms_frequency_rad_s < inf
    return (m.gain_margin, m.phase_margin_deg, 1 / m.ms if interior else inf, wpc, wgc,
            m.ms_frequency_rad_s if interior else nan)


@pytest.mark.parametrize("name,sys,ref,refall", TSYS, ids=[t[0] for t in TSYS])
def test_reference_table(name, sys, ref, refall):
    m = stability_margins(DelayedLoop(control.tf(sys)))
    ours = _ours(m)
    np.testing.assert_allclose(np.array(ours)[[0, 1, 3, 4]], np.array(ref)[[0, 1, 3, 4]], atol=ATOL_MARGIN)
    np.testing.assert_allclose(ours, ref, atol=ATOL_ALL)
    if ref[2] == inf:  # no interior minimum of |1 + L|: our peak is at w = 0 or inf
        assert m.ms_frequency_rad_s in (0.0, inf)
    # every crossing, as returnall lists them (compare_allmargins: atol 1.5e-2)
    gms, pms, _, wpcs, wgcs, _ = refall
    np.testing.assert_allclose([c.frequency_rad_s for c in m.gain_crossings], wgcs, atol=ATOL_ALL)
    np.testing.assert_allclose([c.phase_margin_deg for c in m.gain_crossings], pms, atol=ATOL_ALL)
    np.testing.assert_allclose([c.frequency_rad_s for c in m.phase_crossings], wpcs, atol=ATOL_ALL)
    np.testing.assert_allclose([c.gain_factor for c in m.phase_crossings], gms, atol=ATOL_ALL)
    assert m.stable == STABLE[name]


@pytest.mark.parametrize("name,sys", [(t[0], t[1]) for t in TSYS], ids=[t[0] for t in TSYS])
def test_against_python_control_now(name, sys):
    """The same comparison against the installed python-control, to 1e-6."""
    sys = control.tf(sys)
    m = stability_margins(DelayedLoop(sys))
    gm, pm, sm, wpc, wgc, wms = control.stability_margins(sys)
    ours = _ours(m)
    np.testing.assert_allclose(ours[:2], [gm, pm], rtol=1e-6)
    np.testing.assert_allclose(ours[3:5], [wpc, wgc], rtol=1e-6)
    np.testing.assert_allclose([ours[2], ours[5]], [sm, wms], rtol=1e-6)
    gms, pms, _, wpcs, wgcs, _ = control.stability_margins(sys, returnall=True)
    np.testing.assert_allclose([c.phase_margin_deg for c in m.gain_crossings], pms, rtol=1e-6)
    np.testing.assert_allclose([c.frequency_rad_s for c in m.gain_crossings], wgcs, rtol=1e-6)
    np.testing.assert_allclose([c.gain_factor for c in m.phase_crossings], gms, rtol=1e-6)


def test_verdicts_match_closed_loop_poles():
    for name, sys, *_ in TSYS:
        poles = control.feedback(control.tf(sys), 1).poles()
        m = stability_margins(DelayedLoop(control.tf(sys)))
        assert m.closed_loop_rhp_poles == int(np.sum(poles.real > 0)), name
        assert m.stable == bool(np.all(poles.real < 0)) == STABLE[name], name


# With a delay: the exact-delay margins against python-control on a Pade model of order 10
# (phase within 0.01 deg of the delay up to w delay = 11).
PADE_ORDER = 10
DELAYED = [("tf1", 0.5), ("tf2", 0.2), ("ss-unstable", 0.1), ("three-crossovers", 0.02),
           ("first-order", 1.0), ("nonminimum-phase", 0.1)]


@pytest.mark.parametrize("name,delay", DELAYED)
def test_delayed_margins_match_pade_model(name, delay):
    sys = control.tf(dict((t[0], t[1]) for t in TSYS)[name])
    m = stability_margins(DelayedLoop(sys, delay))
    model = sys * control.tf(*control.pade(delay, PADE_ORDER))
    gm, pm, sm, wpc, wgc, wms = control.stability_margins(model)
    gms, pms, _, wpcs, wgcs, _ = control.stability_margins(model, returnall=True)
    band = 10.0 / delay  # where the Pade model tracks the delay
    np.testing.assert_allclose([c.frequency_rad_s for c in m.gain_crossings], wgcs, rtol=0.01)
    np.testing.assert_allclose([c.phase_margin_deg for c in m.gain_crossings], pms, rtol=0.01)
    np.testing.assert_allclose(m.phase_margin_deg, pm, rtol=0.01)
    # phase crossings in the Pade model's band, up to the gain factor 1e3 the report lists
    ours_pc = [(c.frequency_rad_s, c.gain_factor) for c in m.phase_crossings if c.frequency_rad_s < band]
    theirs = sorted((w, g) for w, g in zip(wpcs, gms) if w < band and g <= 1e3)
    np.testing.assert_allclose(ours_pc, theirs, rtol=0.01)
    np.testing.assert_allclose(1.0 / m.ms, sm, rtol=0.01)
    np.testing.assert_allclose(m.ms_frequency_rad_s, wms, rtol=0.01)
    if m.stable and m.open_loop_rhp_poles == 0:
        np.testing.assert_allclose(m.gain_margin, gm, rtol=0.01)
    # and the verdict against the Pade model's closed-loop poles
    poles = control.feedback(model, 1).poles()
    assert m.closed_loop_rhp_poles == int(np.sum(poles.real > 0))


def test_biproper_loop_with_delay_is_rejected():
    """|L(j inf)| = 3 with any delay: infinitely many right-half-plane closed-loop poles."""
    with pytest.raises(ConfigError, match="neutral loop"):
        stability_margins(DelayedLoop(3 * (10 + s) / (2 + s), 0.1))
    m = stability_margins(DelayedLoop(3 * (10 + s) / (2 + s)))
    assert m.stable and m.delay_margin_s == 0.0   # stable without delay, destabilised by any
