
import pytest

from studies.feedback_oscillation import scenario_path
from tokenfactory.scenario import load_scenario


@pytest.fixture(scope="session")
def smoothed_scenario():
    """The feedback-oscillation study's plant with its auto-tuned smoothed controller."""
    return load_scenario(scenario_path("smoothed"))


@pytest.fixture(scope="session")
def naive_scenario():
    return load_scenario(scenario_path("naive"))


def run_study_without_traces(name, tmp_path_factory):
    """Run a study's quick variant with an empty trace folder (the synthetic fallback); returns
    (output folder, metrics)."""
    import json

    from studies import run_study

    mp = pytest.MonkeyPatch()
    mp.setenv("TOKENFACTORY_TRACES", str(tmp_path_factory.mktemp("no-traces")))
    out = tmp_path_factory.mktemp(name)
    try:
        run_study(name, out, quick=True)
    finally:
        mp.undo()
    return out, json.loads((out / "metrics.json").read_text())
