"""Events live in the core layer, validate themselves, and each plant accepts only its kinds."""

import pytest

from tokenfactory import ConfigError
from tokenfactory.core.events import (
    EVENT_KINDS,
    DecodeRateDip,
    DemandStep,
    LinkSlowdown,
    Reconfiguration,
    WorkerCrash,
    events_from_dicts,
)
from tokenfactory.plant_models import ClusterConfig, LoopScenario, PoolScenario
import tokenfactory.plant_models as pm


def test_reexported_from_plant_models():
    for name, cls in EVENT_KINDS.items():
        assert getattr(pm, cls.__name__) is cls and cls.kind == name


@pytest.mark.parametrize("make,field", [
    (lambda: DemandStep(-1.0, 2.0), "demand_step.at_s"),
    (lambda: DecodeRateDip(0.0, 1.0, 0.0), "decode_rate_dip.factor"),
    (lambda: LinkSlowdown(0.0, -1.0, 0.5), "link_slowdown.duration_s"),
    (lambda: WorkerCrash(1.0, "gpu"), "worker_crash.pool"),
    (lambda: Reconfiguration(1.0, "fill", "fill"), "reconfiguration.target"),
    (lambda: Reconfiguration(1.0, "fill", "decode", count=0), "reconfiguration.count"),
])
def test_events_validate_themselves(make, field):
    with pytest.raises(ConfigError, match=field):
        make()


def test_tables_name_the_failing_entry():
    evs = events_from_dicts([{"kind": "worker_crash", "at_s": 3.0}, DecodeRateDip(1.0, 2.0, 0.5)], "x.events",
                            ("worker_crash", "decode_rate_dip"))
    assert evs == (WorkerCrash(3.0), DecodeRateDip(1.0, 2.0, 0.5))
    with pytest.raises(ConfigError, match=r"x.events\[1\].factor"):
        events_from_dicts([{"kind": "demand_step", "at_s": 1, "factor": 2},
                           {"kind": "link_slowdown", "start_s": 0, "duration_s": 1, "factor": -1}], "x.events",
                          EVENT_KINDS)
    with pytest.raises(ConfigError, match=r"x.events\[0\]"):
        events_from_dicts([{"kind": "worker_crash"}], "x.events", EVENT_KINDS)  # at_s missing


def test_each_plant_accepts_its_kinds():
    assert ClusterConfig(events=(WorkerCrash(1.0), LinkSlowdown(0, 1, 0.5))).events
    with pytest.raises(ConfigError, match=r"cluster.events\[0\]"):
        ClusterConfig(events=(DemandStep(1.0, 2.0),))
    with pytest.raises(ConfigError, match=r"scenario.disturbances\[0\]"):
        LoopScenario(demand=1.0, disturbances=(WorkerCrash(1.0),))
    with pytest.raises(ConfigError, match=r"scenario.disturbances\[0\]"):
        PoolScenario(1.0, 10.0, disturbances=(DecodeRateDip(0, 1, 0.5),))
    sc = LoopScenario.from_dict({"disturbances": [{"kind": "decode_rate_dip", "start_s": 1, "duration_s": 2,
                                                   "factor": 0.5}]}, demand=1.0)
    assert sc.disturbances == (DecodeRateDip(1, 2, 0.5),)
