"""The calibrated service-model parameters (issue 24), written by
``tokenfactory calibrate fit FILE --write`` - do not edit by hand; refit instead.

Fitted by robust least squares on the measured serving runs of NVIDIA AIConfigurator's silicon
sample (``measurements/aiconfigurator-silicon``, H100/H200/B200, trtllm/sglang/vllm), each run
predicted by the closed-loop steady-state solve of :mod:`tokenfactory.plant_models.calibration`,
together with the 13 published DeepSeek-V3/R1 deployments (which bind the scale-out network).
Collectives cost a latency (``collective_latency_s`` per collective plus ``scale_up_latency_s``
per NVLink round, fitted) plus bytes over the link; ``fixed`` holds what is not fitted: the
NVLink bandwidth efficiency at its documented bus bandwidth and the NIC round latency.
``std_error`` is the Gauss-Newton standard error at the optimum; ``cross_validated`` the
held-out errors leaving one GPU / one engine out; ``in_sample`` the errors on every run.
"""

__all__ = ["CALIBRATED"]

CALIBRATED = {'params': {'compute': 0.6625,
            'memory': 0.4022,
            'network_scale_out': 0.4887,
            'layer_overhead_s': 3.852e-09,
            'collective_latency_s': 2.239e-05,
            'scale_up_latency_s': 4.107e-06,
            'pass_overhead_s': 1.238e-19,
            'routing_locality': 0.5913,
            'first_wave_weight': 0.5316,
            'ttft_overhead_s': 0.07502,
            'ttft_s_per_input_token': 2.433e-05,
            'ttft_factor_sglang': 1.83,
            'ttft_factor_vllm': 0.5755},
 'fixed': {'network': 0.8, 'scale_out_latency_s': 5e-06},
 'std_error': {'compute': 0.28,
               'memory': 0.095,
               'network_scale_out': 0.05,
               'layer_overhead_s': 9.1e-05,
               'collective_latency_s': 3.6e-05,
               'scale_up_latency_s': 7.8e-06,
               'pass_overhead_s': 0.0,
               'routing_locality': 0.35,
               'first_wave_weight': 0.33,
               'ttft_overhead_s': 0.057,
               'ttft_s_per_input_token': 3.1e-05,
               'ttft_factor_sglang': 0.81,
               'ttft_factor_vllm': 0.23},
 'kv_precision': {'sglang': 'fp8', 'trtllm': 'fp8', 'vllm': 'fp8'},
 'in_sample': {'tpot': {'rows': 2545.0,
                        'median_abs_error': 0.2171,
                        'p10_error': -0.3119,
                        'p90_error': 0.5302,
                        'within_25pct': 0.5568},
               'ttft': {'rows': 2545.0,
                        'median_abs_error': 0.3439,
                        'p10_error': -0.5077,
                        'p90_error': 1.156,
                        'within_25pct': 0.3807}},
 'cross_validated': {'hardware': {'tpot': {'rows': 2545.0,
                                           'median_abs_error': 0.2446,
                                           'p10_error': -0.3332,
                                           'p90_error': 0.6271,
                                           'within_25pct': 0.5088},
                                  'ttft': {'rows': 2545.0,
                                           'median_abs_error': 0.3857,
                                           'p10_error': -0.569,
                                           'p90_error': 1.3222,
                                           'within_25pct': 0.3336}},
                     'engine': {'tpot': {'rows': 2545.0,
                                         'median_abs_error': 0.3182,
                                         'p10_error': -0.2384,
                                         'p90_error': 0.9473,
                                         'within_25pct': 0.4126},
                                'ttft': {'rows': 2545.0,
                                         'median_abs_error': 0.5403,
                                         'p10_error': -0.604,
                                         'p90_error': 1.7756,
                                         'within_25pct': 0.2173}}},
 'provenance': {'source': 'measurements/aiconfigurator-silicon/silicon_calibration.csv',
                'runs': 2545,
                'train_rows': 111,
                'per_group': 1,
                'max_nfev': 20,
                'seed': 0,
                'method': 'steady-state',
                'ttft_weight': 0.5,
                'folds_start': 'FIT_START',
                'command': 'tokenfactory calibrate fit FILE --per-group 1 --max-nfev 20 --write'}}
