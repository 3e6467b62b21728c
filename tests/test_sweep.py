"""Sweeps: generated configurations, and the same DataFrame serially and on a Dask LocalCluster."""

import numpy as np
import pandas as pd
import pytest

from tokenfactory import ConfigError
from tokenfactory.sweep import Sweep, run_sweep, set_dotted


def noisy_queue_point(cfg: dict) -> dict:
    """A seeded M/M/1-like queue walk: the result depends on every config field and the seed."""
    rng = np.random.default_rng(cfg["seed"])
    rate, service = cfg["load"]["rate"], cfg["plant"]["service"]
    q, total = 0.0, 0.0
    for _ in range(500):
        q = max(0.0, q + rng.poisson(rate) - rng.poisson(service))
        total += q
    return {"mean_queue": total / 500, "final_queue": q}


def margins_batch_point(cfgs: list[dict]) -> list[dict]:
    """A batched point function (a chunk at once): the batched margins kernel on k e^{-theta s}/s."""
    from tokenfactory.controllers import gain_delay_margins

    rows = gain_delay_margins(cfgs, [1.0], [1.0, 0.0], gain_key="gain", delay_key="delay_s")
    return [{"phase_margin_deg": r["phase_margin_deg"], "stable": r["stable"]} for r in rows]


BASE = {"plant": {"service": 5}, "load": {"rate": 3}, "seed": 0}


def test_configs_are_the_grid_product_with_seeds():
    sw = Sweep(BASE, grid={"load.rate": [2, 3, 4], "plant.service": [5, 6]}, seeds=[1, 2])
    cfgs = sw.configs()
    assert len(sw) == len(cfgs) == 12
    assert cfgs[0] == {"plant": {"service": 5}, "load": {"rate": 2}, "seed": 1}
    assert cfgs[-1] == {"plant": {"service": 6}, "load": {"rate": 4}, "seed": 2}
    assert BASE == {"plant": {"service": 5}, "load": {"rate": 3}, "seed": 0}  # the base is untouched
    pts = Sweep(BASE, points=[{"load.rate": 1}, {"plant.service": 9, "seed": 4}]).configs()
    assert pts[1]["plant"]["service"] == 9 and pts[1]["seed"] == 4 and pts[1]["load"]["rate"] == 3


def test_bad_sweeps_are_errors():
    with pytest.raises(ConfigError, match="sweep.grid.load.rate"):
        Sweep(BASE, grid={"load.rate": []})
    with pytest.raises(ConfigError, match="sweep.seeds"):
        Sweep(BASE, seeds=[-1])
    with pytest.raises(ConfigError, match="is a value, not a section"):
        set_dotted(BASE, "seed.x", 1)
    with pytest.raises(ConfigError, match="sweep.backend"):
        run_sweep(noisy_queue_point, Sweep(BASE), backend="spark")
    with pytest.raises(ConfigError, match="sweep.chunk_size"):
        run_sweep(noisy_queue_point, Sweep(BASE), chunk_size=-1)
    assert len(Sweep(BASE, grid={"load.rate": (r for r in (1, 2))}).configs()) == 2  # a generator grid


def test_serial_frame_has_overrides_and_results():
    df = run_sweep(noisy_queue_point, Sweep(BASE, grid={"load.rate": [2, 4]}, seeds=[7]))
    assert list(df.columns) == ["load.rate", "seed", "mean_queue", "final_queue"]
    assert df.loc[1, "mean_queue"] > df.loc[0, "mean_queue"]  # more load, longer queue


def test_dask_local_cluster_equals_serial_exactly():
    sw = Sweep(BASE, grid={"load.rate": [2, 3, 4, 5], "plant.service": [4, 6]}, seeds=[1, 2, 3])
    serial = run_sweep(noisy_queue_point, sw)
    dask = run_sweep(noisy_queue_point, sw, backend="dask", workers=2, chunk_size=5)
    pd.testing.assert_frame_equal(serial, dask)
    batch = Sweep({}, grid={"gain": [0.1, 0.5, 3.0], "delay_s": [0.2, 1.0]})
    a = run_sweep(margins_batch_point, batch, batched=True)
    b = run_sweep(margins_batch_point, batch, backend="dask", workers=2, chunk_size=2, batched=True)
    pd.testing.assert_frame_equal(a, b)
    assert not a.loc[(a["gain"] == 3.0) & (a["delay_s"] == 1.0), "stable"].item()
    # k e^{-theta s}/s: PM = 90 deg - k theta (rad), stable iff k theta < pi/2
    np.testing.assert_allclose(a["phase_margin_deg"], 90.0 - np.degrees(a["gain"] * a["delay_s"]), rtol=1e-9)
    assert (a["stable"] == (a["gain"] * a["delay_s"] < np.pi / 2)).all()


def square_point(x):
    return {"x": x, "x2": x * x}


def test_map_points_keeps_order_and_objects_on_dask(monkeypatch):
    from tokenfactory.sweep import WORKERS_ENV, default_backend, map_points

    assert default_backend() == "serial"
    serial = map_points(square_point, range(7))
    monkeypatch.setenv(WORKERS_ENV, "2")
    assert default_backend() == "dask"
    assert map_points(square_point, range(7)) == serial == [{"x": i, "x2": i * i} for i in range(7)]
    monkeypatch.setenv(WORKERS_ENV, "two")
    with pytest.raises(ConfigError, match="TOKENFACTORY_SWEEP_WORKERS"):
        map_points(square_point, range(3))


def test_the_backend_is_an_argument(monkeypatch):
    """SweepBackend carries where a grid runs; the environment is only the fallback when none is given."""
    from tokenfactory.sweep import WORKERS_ENV, SweepBackend, map_points

    monkeypatch.delenv(WORKERS_ENV, raising=False)
    serial = map_points(square_point, range(5))
    assert SweepBackend().map(square_point, range(5)) == serial
    assert SweepBackend("dask", workers=2).map(square_point, range(5)) == serial
    with pytest.raises(ConfigError, match="sweep.backend"):
        SweepBackend("threads")
    with pytest.raises(ConfigError, match="sweep.workers"):
        SweepBackend("dask", workers=0)


def test_study_cli_passes_the_backend_not_the_environment(monkeypatch, tmp_path):
    """`tokenfactory study --workers N` hands the study a SweepBackend and leaves os.environ alone."""
    import os

    import tokenfactory.studies as studies
    from tokenfactory.cli import main
    from tokenfactory.sweep import SCHEDULER_ENV, WORKERS_ENV, SweepBackend

    monkeypatch.delenv(WORKERS_ENV, raising=False)
    monkeypatch.delenv(SCHEDULER_ENV, raising=False)
    seen = {}

    def fake_run_study(name, out, quick=False, full=False, sweep=None):
        seen.update(name=name, sweep=sweep)
        return {"provenance": {"wall_seconds": 0.0}, "report": {}}

    monkeypatch.setattr(studies, "run_study", fake_run_study)
    assert main(["study", "bandwidth-capacity", "--quick", "--workers", "2", "--out", str(tmp_path / "bc")]) == 0
    assert seen == {"name": "bandwidth-capacity", "sweep": SweepBackend("dask", workers=2)}
    assert WORKERS_ENV not in os.environ and SCHEDULER_ENV not in os.environ
