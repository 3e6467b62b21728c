
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
