"""The registry: every controller kind by name, in one place.

Scenario files, studies and the CLI's choices all build controllers through this module, so a new
policy is added by one :func:`register` call (its builder, its accepted parameters and a line of
description) and appears everywhere - ``tokenfactory simulate --admission``, scenario TOML
``[controller] kind = ...``, the study comparisons.

A builder takes a :class:`PlantContext` (the roofline rates of the plant the controller will run on,
the pool sizes, SLOs and demand it is tuned for) and a mapping of parameters; unknown parameters
are rejected with their name.

* admission kinds (the seconds layer): ``open``, ``naive``, ``threshold``, ``smoothed``,
  ``slo-aware`` (the recommended one, :data:`RECOMMENDED_ADMISSION`: per-request SLO-aware
  admission with request classes, reserved interactive capacity and the gated decode batch cap)
  and today's baselines ``vllm-watermark``, ``mooncake``, ``mooncake-predictive``;
* autoscaler kinds (the reconfiguration layer, a builder returns one controller per pool, or one
  for both): ``hpa``, ``kpa``, ``dynamo-throughput``, ``dynamo-load``, ``dynamo-planner`` (NVIDIA's
  own planner code, the ``dynamo`` extra), ``apa`` and ``hysteretic``;
* :data:`CONTROL_PLANES`: the combinations deployments run (an autoscaler kind and an admission
  kind), used by the comparisons.

One idea per module, all names flat here: :mod:`~tokenfactory.registry.kinds` (the kind record,
:func:`register`, the tables, :class:`PlantContext`), :mod:`~tokenfactory.registry.admission_kinds`
(the admission kinds and the batch gate), :mod:`~tokenfactory.registry.autoscaler_kinds`,
:mod:`~tokenfactory.registry.deployments` (control planes and baseline stacks of the comparisons),
:mod:`~tokenfactory.registry.kind_settings` (each kind's parameters: type, unit, range, default, meaning),
:mod:`~tokenfactory.registry.stack_layers` (the stack's layer kinds: typed configs naming their
builders and certificate loops).
"""

from tokenfactory.registry import autoscaler_kinds  # noqa: F401  (registers the autoscaler kinds)
from tokenfactory.registry.autoscaler_kinds import HystereticParams
from tokenfactory.registry.admission_kinds import (
    batch_gate_for,
    batch_gate_tuning,
    cached_gate_tuning,
    flat_margin_tuning,
    margin_tuning,
    slo_admission_tuning,
    slo_aware_admission,
    smoothed_admission,
    static_batch_cap,
)
from tokenfactory.registry.deployments import BASELINE_STACKS, CONTROL_PLANES, baseline_stack, control_plane
from tokenfactory.registry.kinds import (
    ADMISSION_KINDS,
    AUTOSCALER_KINDS,
    DEFAULT_TPOT_FRACTION,
    RECOMMENDED_ADMISSION,
    TARGET_UTILIZATION,
    ControllerKind,
    PlantContext,
    admission_kinds,
    autoscaler_kinds,
    build_admission,
    build_autoscalers,
    register,
)

__all__ = ["PlantContext", "ControllerKind", "register", "ADMISSION_KINDS", "AUTOSCALER_KINDS",
           "CONTROL_PLANES", "build_admission", "build_autoscalers", "control_plane", "admission_kinds",
           "autoscaler_kinds", "smoothed_admission", "TARGET_UTILIZATION", "BASELINE_STACKS", "baseline_stack",
           "slo_aware_admission", "slo_admission_tuning", "margin_tuning", "flat_margin_tuning", "batch_gate_for",
           "static_batch_cap", "batch_gate_tuning", "cached_gate_tuning", "RECOMMENDED_ADMISSION", "DEFAULT_TPOT_FRACTION",
           "HystereticParams"]
