"""Study `incidents` (quick): each reported incident is predicted by the loop model, seen in the
pool model, and its advised setting of the same control plane holds."""

from __future__ import annotations

import pytest

from tokenfactory.core.errors import ConfigError
from tokenfactory.studies import incidents


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    return incidents.run(tmp_path_factory.mktemp("incidents"), quick=True)


def test_cascades_are_predicted_and_seen(result):
    for name in ("aibrix-2670", "hpa-startup-cascade"):
        r = result["incidents"][name]
        # the start-up overshoot the loop model predicts is what the pool model does
        assert r["predicted"]["cascade_peak_replicas"] == r["simulated"]["peak_replicas"]
        assert not r["predicted"]["passed"]
    assert result["incidents"]["aibrix-2670"]["simulated"]["peak_replicas"] == \
        incidents.INCIDENTS["aibrix-2670"]["reported"]["peak_replicas"]


def test_queue_length_flapping_period_within_20_percent(result):
    r = result["incidents"]["queue-length-flapping"]
    predicted, simulated = r["predicted"]["predicted_cycle"]["period_s"], r["simulated"]["period_s"]
    assert simulated is not None and predicted == pytest.approx(simulated, rel=0.2)
    assert r["simulated"]["reversals_per_hour"] > 2.0


def test_every_advised_setting_passes_and_does_not_churn(result):
    for name, r in result["incidents"].items():
        assert r["advised_predicted"]["passed"], name
        assert r["advised_simulated"]["reversals_per_hour"] <= 2.0, name
        assert r["advised_simulated"]["peak_replicas"] <= r["simulated"]["peak_replicas"], name


def test_unknown_config_key_is_named(tmp_path):
    with pytest.raises(ConfigError) as err:
        incidents.run(tmp_path, quick=True, config={"incident": ["x"]})
    assert err.value.field == "incidents.incident"
