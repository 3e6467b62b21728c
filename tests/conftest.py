import math
import os

import pytest
from hypothesis import settings

from tokenfactory.scenario import load_scenario
from tokenfactory.studies.feedback_oscillation import scenario_path

# Property tests draw the same examples on every run (CI verdicts do not depend on luck);
# HYPOTHESIS_PROFILE=explore draws fresh ones.
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


class ScriptedController:
    """Returns scripted actions at given times ({time: actions}) and records every measurement it
    was given (a controller double for plant tests)."""

    def __init__(self, script, sample_period=1.0):
        self.script, self.sample_period = dict(script), sample_period

    def reset(self):
        self.seen = []

    def update(self, t, m):
        self.seen.append(m)
        return self.script.get(round(t, 6), [])


@pytest.fixture(scope="module")
def fp():
    """Fluid parameters of DeepSeek-V3 on 8xH200 at a 2048/512 request (the pool-model tests' plant)."""
    from tokenfactory.plant_models import FluidParams, RequestShape, Worker

    w = Worker.from_dict({"model": "deepseek-v3", "hardware": "h200"})
    return FluidParams.from_workers(w, w, RequestShape(2048, 512))


class ConstantAdmission:
    """A controller commanding a fixed admission rate and backlog bound; records what it saw."""

    def __init__(self, rate, bound=math.inf, sample_period=0.1):
        self.rate, self.bound, self.sample_period, self.seen = rate, bound, sample_period, []

    def reset(self):
        self.seen = []

    def update(self, t, m):
        from tokenfactory.core.signals import AdmissionAction

        self.seen.append((t, m))
        return AdmissionAction(self.rate, self.bound)


@pytest.fixture(scope="session")
def smoothed_scenario():
    """The feedback-oscillation study's plant with its auto-tuned smoothed controller."""
    return load_scenario(scenario_path("smoothed"))


@pytest.fixture(scope="session")
def des_params():
    """Request-simulator service times of DeepSeek-V3 on 8 x H200 fill and decode workers."""
    from tokenfactory.plant_models import DESParams, Worker, accelerator_preset, model_preset

    w = Worker(model_preset("deepseek-v3"), accelerator_preset("h200"))
    return DESParams.from_workers(w, w)


def poisson_trace(rate, duration, seed, inp=2048, out_mean=512):
    """A seeded Poisson request table with geometric output lengths."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, int(rate * duration * 1.2) + 10))
    t = t[t < duration]
    return pd.DataFrame({"arrival_s": t, "input_tokens": inp, "cached_tokens": 0,
                         "output_tokens": rng.geometric(1 / out_mean, len(t))})


def classed_trace(rate_interactive, rate_batch, duration, seed=5, inp=3000, out_mean=150):
    """Poisson interactive and batch streams (seeded) on one clock."""
    import pandas as pd

    parts = []
    for k, (name, rate) in enumerate((("interactive", rate_interactive), ("batch", rate_batch))):
        if rate > 0:
            t = poisson_trace(rate, duration, seed + k, inp=inp, out_mean=out_mean)
            t["request_class"] = name
            parts.append(t)
    return pd.concat(parts).sort_values("arrival_s", kind="stable").reset_index(drop=True)


@pytest.fixture(scope="session")
def naive_scenario():
    return load_scenario(scenario_path("naive"))


def run_study_without_traces(name, tmp_path_factory):
    """Run a study's quick variant with an empty trace folder (the synthetic fallback); returns
    (output folder, metrics)."""
    import json

    from tokenfactory.studies import run_study

    mp = pytest.MonkeyPatch()
    mp.setenv("TOKENFACTORY_TRACES", str(tmp_path_factory.mktemp("no-traces")))
    out = tmp_path_factory.mktemp(name)
    try:
        run_study(name, out, quick=True)
    finally:
        mp.undo()
    return out, json.loads((out / "metrics.json").read_text())


@pytest.fixture(scope="session")
def quick_study(tmp_path_factory):
    """A study's quick-variant report folder, run once per session for every module that reads it
    (the study's own tests and the HTML report's); returns ``get(name) -> folder``. Tests read it
    only: a test that writes beside it copies it first."""
    from tokenfactory.studies import run_study

    done = {}

    def get(name):
        if name not in done:
            out = tmp_path_factory.mktemp(name)
            run_study(name, out, quick=True)
            done[name] = out
        return done[name]

    return get
