"""The calibrated service-model parameters (issue 24), written by
``tokenfactory calibrate fit FILE --write`` - do not edit by hand; refit instead.

Fitted by robust least squares on the measured serving runs of NVIDIA AIConfigurator's silicon
sample (``measurements/aiconfigurator-silicon``, H100/H200/B200, trtllm/sglang/vllm), each run
predicted by the closed-loop steady-state solve of :mod:`tokenfactory.plant_models.calibration`,
together with the 13 published DeepSeek-V3/R1 deployments (which bind the scale-out network).
Collectives cost a latency (``collective_latency_s`` per collective plus ``scale_up_latency_s``
per NVLink round, fitted) plus bytes over the link; a pass pays ``sequence_overhead_s`` per
sequence on its attention rank and reads KV at ``attention_memory`` of HBM bandwidth (both
fitted); ``fixed`` holds what is not fitted: the
NVLink bandwidth efficiency at its documented bus bandwidth and the NIC round latency.
``std_error`` is the Gauss-Newton standard error at the optimum; ``cross_validated`` the
held-out errors leaving one GPU / one engine out; ``in_sample`` the errors on every run.
"""

__all__ = ["CALIBRATED"]

CALIBRATED = {'params': {'compute': 0.7869,
            'memory': 0.5929,
            'network_scale_out': 0.4948,
            'layer_overhead_s': 1.563e-05,
            'collective_latency_s': 1.728e-05,
            'scale_up_latency_s': 3.814e-06,
            'pass_overhead_s': 3.855e-18,
            'routing_locality': 0.9998,
            'sequence_overhead_s': 3.059e-05,
            'attention_memory': 0.3313,
            'first_wave_weight': 0.6468,
            'ttft_overhead_s': 0.07755,
            'ttft_s_per_input_token': 2.488e-05,
            'ttft_factor_sglang': 1.881,
            'ttft_factor_vllm': 0.5751},
 'fixed': {'network': 0.8, 'scale_out_latency_s': 5e-06},
 'std_error': {'compute': 0.4,
               'memory': 0.19,
               'network_scale_out': 0.052,
               'layer_overhead_s': 7.1e-05,
               'collective_latency_s': 3e-05,
               'scale_up_latency_s': 7.3e-06,
               'pass_overhead_s': 0.00021,
               'routing_locality': 0.64,
               'sequence_overhead_s': 2.1e-05,
               'attention_memory': 0.17,
               'first_wave_weight': 0.42,
               'ttft_overhead_s': 0.053,
               'ttft_s_per_input_token': 2.9e-05,
               'ttft_factor_sglang': 0.78,
               'ttft_factor_vllm': 0.22},
 'kv_precision': {'sglang': 'fp8', 'trtllm': 'fp8', 'vllm': 'fp8'},
 'in_sample': {'tpot': {'rows': 2545.0,
                        'median_abs_error': 0.1844,
                        'p10_error': -0.2749,
                        'p90_error': 0.4035,
                        'within_25pct': 0.6546},
               'ttft': {'rows': 2545.0,
                        'median_abs_error': 0.3485,
                        'p10_error': -0.5139,
                        'p90_error': 1.2176,
                        'within_25pct': 0.3729}},
 'cross_validated': {'hardware': {'tpot': {'rows': 2545.0,
                                           'median_abs_error': 0.2138,
                                           'p10_error': -0.2892,
                                           'p90_error': 0.5107,
                                           'within_25pct': 0.5654},
                                  'ttft': {'rows': 2545.0,
                                           'median_abs_error': 0.389,
                                           'p10_error': -0.5702,
                                           'p90_error': 1.3643,
                                           'within_25pct': 0.321}},
                     'engine': {'tpot': {'rows': 2545.0,
                                         'median_abs_error': 0.3081,
                                         'p10_error': -0.2177,
                                         'p90_error': 0.7855,
                                         'within_25pct': 0.4157},
                                'ttft': {'rows': 2545.0,
                                         'median_abs_error': 0.5224,
                                         'p10_error': -0.6336,
                                         'p90_error': 1.7395,
                                         'within_25pct': 0.2212}}},
 'provenance': {'source': 'measurements/aiconfigurator-silicon/silicon_calibration.csv',
                'runs': 2545,
                'train_rows': 111,
                'per_group': 1,
                'max_nfev': 12,
                'seed': 0,
                'method': 'steady-state',
                'ttft_weight': 0.5,
                'folds_start': 'FIT_START',
                'command': 'tokenfactory calibrate fit FILE --per-group 1 --max-nfev 12 --write'}}
