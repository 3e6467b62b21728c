"""Stack scenarios: the whole layered control stack in one TOML, built, certified and run.

A stack scenario names the plant, the SLO, the nominal demand, the worker dynamics, each layer
(batch gate, admission, reconfiguration, planning) and the envelope the stack must hold over.
One idea per module:

* :mod:`~tokenfactory.stack.stack_scenario` - :func:`load_stack_scenario` validates the file up
  front (unknown keys are errors naming the field) into a :class:`StackScenario`;
* :mod:`~tokenfactory.stack.plant` - what the stack is built for: the plant with the batch gate
  applied (:func:`stack_plant`), pool sizes, the gate's share of the TPOT SLO, loop delays;
* :mod:`~tokenfactory.stack.layer_builders` - each layer kind's builder (named by its config
  class in :mod:`tokenfactory.registry.stack_layers`);
* :mod:`~tokenfactory.stack.build` - :func:`build_stack` turns a scenario into a
  :class:`tokenfactory.controllers.control_stack.ControlStack` for a plant, calling every layer's
  builder;
* :mod:`~tokenfactory.stack.layer_certificates` - each layer kind's certificate loops (margins over
  the envelope, describing-function checks, separation from the layer below);
* :mod:`~tokenfactory.stack.certificate` - :func:`certify`, the stack certificate
  (``tokenfactory certify``): every layer's loops with the binding point named, the separation
  floors of each adjacent pair of layers, the describing-function checks, and a verdict;
* :mod:`~tokenfactory.stack.on_rates` - :func:`run_on_rates`, the stack (or a baseline) over a
  rate series in the pool model, scored against the oracle;
* :mod:`~tokenfactory.stack.on_requests` - the same stack in the request simulator.

The shipped scenarios are in ``tokenfactory/scenarios`` (:func:`tokenfactory.scenario.scenario_dir`);
:func:`load_stack_scenario` takes a path or a shipped scenario's name:

>>> from tokenfactory.stack import load_stack_scenario
>>> sc = load_stack_scenario("stack_default")
>>> sorted(sc.layers)
['admission', 'batch_gate', 'planning', 'reconfiguration']

A scenario's layout (every table but ``[plant]``, ``[workload]`` and ``[layers.reconfiguration]``
is optional; the values shown are the defaults where there is one):

>>> import tomllib
>>> from tokenfactory.stack import stack_scenario_from_dict
>>> sc = stack_scenario_from_dict(tomllib.loads('''
... name = "example"
... [plant]                       # as in scenario files, without pool sizes
... model = "deepseek-v3"
... hardware = "h200"
... prompt_tokens = 914
... output_tokens = 155
... [slo]
... ttft_s = 2.0
... tpot_s = 0.1
... [workload]
... rate_rps = 760.0              # nominal demand the stack is tuned for
... [dynamics]
... startup_s = 600
... [layers.batch_gate]
... kind = "slot-limit"
... [layers.admission]
... kind = "smoothed"
... sample_period_s = 1.0
... [layers.reconfiguration]
... kind = "planned-hysteretic"
... sample_period_s = 10.0
... [layers.planning]
... kind = "seasonal-rise"
... days = 3
... [envelope]
... delay_factors = [0.5, 1.0, 2.0]
... service_rate_factors = [0.7, 1.0, 1.3]
... demand_factors = [0.5, 1.0, 1.5]
... startup_factors = [0.75, 1.0, 1.5]
... [certificate]
... min_separation = 5.0
... max_pm_loss_deg = 5.0
... '''))
>>> sc.name, sc.rate_rps, sc.dynamics.startup_s
('example', 760.0, 600)
"""

from tokenfactory.stack.build import build_stack
from tokenfactory.stack.certificate import Certificate, certify
from tokenfactory.stack.layer_builders import (
    LayerBuild,
    gated_batch_cap,
    slo_aware_admission_controller,
    smoothed_admission_controller,
)
from tokenfactory.stack.layer_certificates import CertificateDraft, LayerLoops
from tokenfactory.stack.on_rates import (
    OSCILLATION_HIGHPASS_S,
    STATIC_SPLIT,
    mixed_workload_for,
    run_on_rates,
)
from tokenfactory.stack.plant import (
    GATE_FLOOR,
    GATE_SAMPLE_PERIOD_S,
    StackPlant,
    gate_fraction,
    gate_sample_period_s,
    gate_tuning,
    overload_tpot_s,
    planning_lead_s,
    plant_for,
    pools_at,
    queue_clear,
    reconfiguration_delay_s,
    scale_down_dwell_s,
    slot_limit,
    stack_plant,
    target_utilization,
)
from tokenfactory.stack.on_requests import (
    morning_ramp,
    requests_as_rates,
    run_stack_on_both_plants,
    run_stack_on_requests,
)
from tokenfactory.stack.stack_scenario import StackScenario, load_stack_scenario, stack_scenario_from_dict

__all__ = ["StackScenario", "load_stack_scenario", "stack_scenario_from_dict", "StackPlant", "stack_plant",
           "slot_limit", "reconfiguration_delay_s", "target_utilization", "pools_at", "GATE_FLOOR", "gate_fraction",
           "overload_tpot_s", "GATE_SAMPLE_PERIOD_S", "gate_sample_period_s", "gate_tuning", "queue_clear",
           "planning_lead_s", "scale_down_dwell_s", "plant_for", "smoothed_admission_controller",
           "slo_aware_admission_controller", "gated_batch_cap", "LayerBuild", "CertificateDraft", "LayerLoops",
           "build_stack", "Certificate",
           "certify", "STATIC_SPLIT", "OSCILLATION_HIGHPASS_S", "run_on_rates", "mixed_workload_for", "morning_ramp",
           "run_stack_on_requests", "requests_as_rates", "run_stack_on_both_plants"]
