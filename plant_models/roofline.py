"""Roofline service model of a worker in the four operating modes (article sections 3, 12, 14-16).

A *worker* is a group of GPUs holding one model replica: ``pp`` pipeline stages of ``ep`` GPUs
each; in a stage, experts are spread over all ``ep`` GPUs (expert parallelism) and attention runs
as ``ep / tp`` data-parallel replicas of ``tp`` GPUs each (DP attention, as DeepSeek deploys MLA).

Every phase of a forward pass is timed as a roofline,

    t = max(FLOPs / (peak x eff_compute), bytes / (HBM bw x eff_memory), a2a / (link bw x eff_net))

and a stage pass sums its phases. With ``overlap_communication`` (the two-micro-batch overlap of
DeepSeek's inference system and SGLang/TensorRT-LLM, which hides the all-to-all of one
micro-batch behind the computation of the other) the network time overlaps the whole pass:
``max(sum of compute/memory times, sum of network times)``.

**Pipeline.** Layers are split evenly over the ``pp`` stages, so a stage does 1/pp of the
model's work for a micro-batch on its ``ep`` GPUs: stage time ``t = work / pp + fixed / pp``,
where ``fixed`` is the per-layer launch/synchronisation overhead times the layers plus the
latency of the collectives. Each stage boundary adds a hand-off ``h`` (one link latency plus the
micro-batch's activations over the link). A micro-batch goes round all stages, so

* decode: the batch of ``B`` sequences is split into ``m = min(pp, B)`` micro-batches in flight;
  TPOT = ``pp x (t(B/m) + h)`` and throughput ``B / TPOT``; with ``m < pp`` stages sit idle
  (the pipeline bubble) - throughput falls while TPOT does not;
* fill: a prompt may be cut into ``chunks`` that follow each other through the stages (chunked
  pipeline prefill); with identical stages the makespan of chunks of stage times ``t_j`` is
  ``sum_j (t_j + h) + (pp - 1) max_j (t_j + h)`` (a permutation flow shop whose jobs take the
  same time on every machine), which is the TTFT; a stream of fills keeps every stage busy, so
  fill throughput is ``tokens / sum_j (t_j + h)``.

At a fixed GPU count, PP therefore trades a longer chain of hand-offs for narrower expert and
tensor groups, whose collectives take fewer latency rounds (``ceil(log2 n)`` rounds of the
recursive-doubling / Bruck algorithms; Thakur, Rabenseifner & Gropp, IJHPCA 19(1), 2005) and,
past the scale-up domain, move off the scale-out network (article section 12).

**All-to-all.** Routed tokens are dispatched at the experts' GEMM precision (FP8 dispatch, BF16
combine in DeepSeek's serving system; FP4 dispatch for NVFP4 experts, SGLang GB200 part II) and
combined at the activation precision. Inside the scale-up domain every copy crosses NVLink; past
it, fill passes send one copy per destination node and forward it over NVLink (DeepEP normal
kernels) while decode sends one copy per remote expert (DeepEP low-latency kernels).

Modelled simplifications, stated so users can judge them: experts are balanced over the GPUs of a
stage (the busiest GPU holds at least one active expert per layer); MLA's latent KV is replicated
over TP ranks (each rank reads all of it), GQA's KV is sharded over min(tp, kv_heads); activation
and KV-write traffic is counted; the efficiencies and the per-layer overhead are fitted to
published deployments (study ``roofline-validation``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tokenfactory.plant_models.hardware import PRECISIONS, Accelerator, load_accelerator
from tokenfactory.plant_models.moe_model import MoEModel, load_model
from tokenfactory.core.validation import (ConfigError, check_fields, check_int, check_number, reject_unknown_keys,
                                          setting)

#: where the fitted efficiency defaults come from
_FITTED = ("fitted to 13 published DeepSeek-V3/R1 deployments (plant_models.published_points.FITTED_EFFICIENCY, "
           "study roofline-validation)")

__all__ = [
    "Efficiency",
    "Parallelism",
    "PhaseTime",
    "PassTime",
    "Worker",
    "roofline_time",
    "distinct_experts",
    "expert_arithmetic_intensity",
    "collective_rounds",
    "decode_sweep",
]


def roofline_time(flops: float, bytes_moved: float, peak_flops: float, bandwidth: float) -> float:
    """max(FLOPs / peak, bytes / bandwidth): the roofline time of one kernel.

    The roofline model of Williams, Waterman & Patterson (CACM 52(4), 2009); article section 3
    explains why prefill, midfill and decode land on different sides of its ridge.

    Efficiencies are applied by the caller (:class:`Worker` scales peak and bandwidth by
    :class:`Efficiency`).

    Parameters
    ----------
    flops : float
        Floating-point operations of the kernel (FLOP).
    bytes_moved : float
        Bytes read from and written to memory (bytes).
    peak_flops : float
        Attainable compute rate (FLOP/s, > 0).
    bandwidth : float
        Attainable memory bandwidth (bytes/s, > 0).

    Returns
    -------
    float
        The kernel's time (s): compute-bound when intensity flops / bytes_moved exceeds the ridge
        point peak_flops / bandwidth, memory-bound otherwise.

    Raises
    ------
    ConfigError
        For a non-positive ``peak_flops`` or ``bandwidth``, or negative work.
    """
    if not (peak_flops > 0 and bandwidth > 0):  # also catches NaN
        bad = "peak_flops" if not peak_flops > 0 else "bandwidth"
        raise ConfigError(bad, f"{peak_flops if bad == 'peak_flops' else bandwidth} is outside (0, inf)")
    if flops < 0 or bytes_moved < 0:
        raise ConfigError("flops" if flops < 0 else "bytes_moved", "work must be >= 0")
    return max(flops / peak_flops, bytes_moved / bandwidth)


def distinct_experts(routed_experts: int, active_experts: int, tokens: float) -> float:
    """Expected distinct experts one layer touches for ``tokens`` routed tokens.

    Each token picks ``k`` of ``E`` experts; with uniform routing an expert is missed by one token
    with probability 1 - k/E, so E[distinct] = E (1 - (1 - k/E)^B)  (article section 16).

    Parameters
    ----------
    routed_experts : int
        Routed experts E per MoE layer (>= 1).
    active_experts : int
        Experts k each token picks, in [1, E].
    tokens : float
        Routed tokens B in the layer's batch (>= 0; fractional for averages).

    Returns
    -------
    float
        Expected number of distinct experts touched, in [0, E] (each one's weights are read once).

    Raises
    ------
    ConfigError
        For negative ``tokens`` or k outside [1, E].
    """
    if tokens < 0:
        raise ConfigError("tokens", f"{tokens} is outside the allowed range [0, inf)")
    if not 1 <= active_experts <= routed_experts:
        raise ConfigError("active_experts", f"k = {active_experts} must be in [1, {routed_experts}]")
    return routed_experts * (1.0 - (1.0 - active_experts / routed_experts) ** tokens)


def expert_arithmetic_intensity(n_tokens, weights: float, weight_bytes: float,
                                activation_bytes: float, output_bytes_per_token: float):
    """AI_expert ~ 2 n W / (B_W + n B_A + B_O)  (article section 15), B_O = n x output bytes/token.

    ``weights`` W is the parameter count of one expert, ``weight_bytes`` its bytes B_W,
    ``activation_bytes`` B_A the bytes of one routed token's activation. As n grows the weight
    read is amortised and AI flattens at 2W / (B_A + b_O), where activation traffic dominates.

    Parameters
    ----------
    n_tokens : float or array_like
        Tokens n routed to the expert in one pass (>= 0).
    weights : float
        Parameters W of one expert (count).
    weight_bytes : float
        Bytes B_W of one expert's weights.
    activation_bytes : float
        Bytes B_A of one routed token's input activation.
    output_bytes_per_token : float
        Bytes b_O of one token's output activation (B_O = n b_O).

    Returns
    -------
    float or numpy.ndarray
        Arithmetic intensity (FLOP/byte), the shape of ``n_tokens``; compare it with the
        accelerator's ridge point to see whether the expert GEMM is compute- or memory-bound.

    Raises
    ------
    ConfigError
        For non-positive ``weights`` or ``weight_bytes``, negative activation bytes, or
        negative or non-finite ``n_tokens``.
    """
    check_number("weights", weights, low=0.0, low_inclusive=False)
    check_number("weight_bytes", weight_bytes, low=0.0, low_inclusive=False)
    check_number("activation_bytes", activation_bytes, low=0.0)
    check_number("output_bytes_per_token", output_bytes_per_token, low=0.0)
    n = np.asarray(n_tokens, dtype=float)
    if n.size and (not np.isfinite(n).all() or (n < 0).any()):
        raise ConfigError("n_tokens", "must be finite and >= 0 tokens")
    return 2.0 * n * weights / (weight_bytes + n * activation_bytes + n * output_bytes_per_token)


def collective_rounds(participants: int) -> int:
    """Latency rounds of a collective over ``participants`` GPUs: ceil(log2 n), 0 for one GPU
    (recursive doubling for all-reduce, Bruck's algorithm for all-to-all; Thakur et al. 2005).

    Parameters
    ----------
    participants : int
        GPUs taking part (>= 1).

    Returns
    -------
    int
        Rounds, each costing one link latency.

    Raises
    ------
    ConfigError
        For fewer than one participant.
    """
    check_int("participants", participants, low=1)
    return math.ceil(math.log2(participants)) if participants > 1 else 0


@dataclass(frozen=True)
class Efficiency:
    """Fractions of peak a real serving stack reaches, and its fixed costs.

    ``compute``, ``memory``, ``network`` and ``layer_overhead_s`` (launch and synchronisation
    cost per layer per stage pass) are fitted by least squares to 13 published DeepSeek-V3/R1
    deployments on H800, H100, H200, B200 and GB200 (study ``roofline-validation``;
    :data:`tokenfactory.plant_models.published_points.FITTED_EFFICIENCY` holds the fit these defaults
    are rounded from; leave-one-out median error 18 %). They are *system* efficiencies - kernel
    efficiency, expert imbalance, scheduling and runtime gaps lumped together - which is why
    memory is far below what a streaming kernel reaches. The assumptions they replace were
    compute 0.6, memory 0.8, network 0.7 and no per-layer overhead.

    **Collectives (alpha-beta model).** A collective over ``n`` GPUs costs a latency term plus
    its bytes over the link: ``t = alpha + bytes / (bandwidth x efficiency)`` (Hockney's model as
    Thakur, Rabenseifner & Gropp, IJHPCA 19(1), 2005, cost MPI's collectives). The latency is
    ``collective_latency_s`` (alpha_0: the launch, synchronisation and protocol cost every
    collective pays whatever its size) plus ``ceil(log2 n)`` rounds of ``scale_up_latency_s``
    (NVLink) or ``scale_out_latency_s`` (NIC) each - NCCL's own tuning model has the same form,
    a base latency plus a per-step hardware latency (``src/graph/tuning.cc``: base 6.6 us for a
    ring in the LL protocol, 0.6 us per NVLink step and 2.7 us per network step). The latency is
    paid on the pass's critical path; only the bandwidth term overlaps compute. Keeping the two
    apart lets ``network`` stay a *bandwidth* efficiency near the links' documented one instead
    of standing in for latency-bound small decode all-reduces.
    ``pass_overhead_s`` is an optional fixed cost per stage pass.

    **Large decode batches (issue 24).** Two costs grow with the batch beyond what the roofline of
    the kernels charges, each 0 / absent by default (the defaults stay the 13-point fit):

    * ``sequence_overhead_s`` - runtime work per running sequence per pass on its attention
      replica (each attention-DP rank schedules its own sequences): scheduler bookkeeping,
      per-request input metadata, sampling and output processing. A pass of ``B`` decodes on
      ``ep / tp`` replicas pays ``sequence_overhead_s x ceil(B / (ep / tp))`` once per token.
      vLLM measured the time between two steps at batch 200 at up to 20 ms of sampling, input
      preparation, output processing and scheduling (vllm-project/vllm issue 6801, 2024) and
      `Scheduler.update_from_output` alone at 0.29 ms for 256 decodes (pull request 46112);
      engines overlap part of it with the GPU, so its share is fitted.
    * ``attention_memory`` - the fraction of HBM bandwidth the decode attention kernel reaches on
      KV reads, apart from ``memory`` (weights): ``t_KV = KV bytes / (HBM bw x attention_memory)``.
      Paged decode kernels range widely with shape: FlashMLA reaches 3,000 of 3,350 GB/s on H800
      when memory-bound (deepseek-ai/FlashMLA README), FlashAttention-3's paged decode 1,014 of
      4,000 GB/s on H20 at 1k context and batch 16 (Dao-AILab/flash-attention issue 1572).

    **Attention-DP imbalance in mixed passes (issue 24).** With attention data parallelism each
    replica schedules its own requests, so a prompt chunk entering an aggregated pass is prefilled
    by the replica that holds the request while the others decode; every replica then waits for
    it at the MoE all-to-all, and the pass takes the busiest replica's time. TensorRT-LLM's
    round-robin scheduler measured a mean per-iteration balance ratio (mean / max tokens over the
    ranks) of 54 % on DeepSeek-V3 at attention DP 8 (EP 8, 8 x GB200; "ADP Balance Strategy",
    TensorRT-LLM tech blog 10, ``docs/source/blogs/tech_blog/blog10_ADP_Balance_Strategy.md``),
    and 84-88 % when contexts wait to be co-scheduled. ``attention_dp_imbalance`` (u, 0 by
    default: the chunk spread evenly, as a fill step is) is the part of a mixed pass's chunk of
    ``C`` tokens beyond an even share that lands on the busiest of ``D = ep / tp`` replicas: that
    replica prefills ``C / D + u C (1 - 1 / D)`` tokens (u = 1: the whole chunk on one replica).
    Its attention and its dense FFN layers and routers (replica-local work) are timed for those
    tokens; the experts see the pass's tokens as before. It does not act without attention DP
    (D = 1) nor in decode-only or fill passes.

    Parameters
    ----------
    compute : float
        Fraction of the dense tensor peak reached, in (0, 1] (default 0.52, fitted).
    memory : float
        Fraction of HBM bandwidth reached, in (0, 1] (default 0.23, fitted).
    network : float
        Fraction of NVLink / NIC bandwidth reached, in (0, 1] (default 0.49, fitted).
    layer_overhead_s : float
        Launch and synchronisation cost per layer per stage pass (s, in [0, 1]; default 84e-6,
        fitted).
    scale_up_latency_s : float
        Latency of one collective round on NVLink (s, in [0, 1]; default 2e-6, assumed).
    scale_out_latency_s : float
        Latency of one collective round on the scale-out NIC (s, in [0, 1]; default 5e-6,
        assumed).
    collective_latency_s : float
        Fixed latency of every collective over more than one GPU, besides its rounds (s, in
        [0, 1]; default 0).
    pass_overhead_s : float
        Fixed cost per stage pass (s, in [0, 1]; default 0).
    network_scale_out : float, optional
        Fraction of the scale-out NIC bandwidth reached, in (0, 1]; ``None`` (default) is
        ``network``, which then covers NVLink and the NICs alike. Single-node benchmarks bind the
        NVLink figure (small TP all-reduces, latency-bound) and large-EP deployments the NIC one.
    routing_locality : float
        How independently a decode batch's tokens pick experts, in (0, 1] (default 1: uniform
        routing). A batch of B tokens reads the distinct experts of 1 + l (B - 1) independent
        tokens; correlated routing (tokens of similar text choosing the same experts) is l < 1.
    sequence_overhead_s : float
        Runtime cost per sequence of a pass on its attention replica (s, in [0, 0.01]; default 0).
    attention_memory : float, optional
        Fraction of HBM bandwidth reached by attention's KV reads and writes, in (0, 1]; ``None``
        (default) is ``memory``.
    attention_dp_imbalance : float
        Part of a mixed pass's prompt chunk beyond an even share that the busiest attention-DP
        replica prefills, in [0, 1] (default 0: spread evenly; 1: the whole chunk on one replica).

    Raises
    ------
    ConfigError
        For a value outside its range (fields ``efficiency.*``).
    """

    compute: float = setting(0.52, low=0.0, high=1.0, low_inclusive=False, source=_FITTED,
                             meaning="fraction of the dense tensor peak reached")
    memory: float = setting(0.23, low=0.0, high=1.0, low_inclusive=False, source=_FITTED,
                            meaning="fraction of HBM bandwidth reached (a system efficiency: imbalance and "
                                    "runtime gaps included)")
    network: float = setting(0.49, low=0.0, high=1.0, low_inclusive=False, source=_FITTED,
                             meaning="fraction of NVLink / NIC bandwidth reached")
    layer_overhead_s: float = setting(84e-6, unit="s", low=0.0, high=1.0, source=_FITTED,
                                      meaning="launch and synchronisation cost per layer per stage pass")
    scale_up_latency_s: float = setting(2e-6, unit="s", low=0.0, high=1.0,
                                        source="assumed: the order of one NVSwitch round trip (not fitted)",
                                        meaning="latency of one collective round on NVLink")
    scale_out_latency_s: float = setting(5e-6, unit="s", low=0.0, high=1.0,
                                         source="assumed: the order of one RDMA round trip (not fitted)",
                                         meaning="latency of one collective round on the scale-out NIC")
    pass_overhead_s: float = setting(0.0, unit="s", low=0.0, high=1.0, meaning="fixed cost per stage pass")
    routing_locality: float = setting(1.0, low=0.0, high=1.0, low_inclusive=False,
                                      meaning="how independently a decode batch's tokens pick experts (1: uniform "
                                              "routing; < 1: correlated routing reads fewer distinct experts)")
    network_scale_out: float | None = setting(None, low=0.0, high=1.0, low_inclusive=False,
                                              meaning="fraction of the scale-out NIC bandwidth reached (absent: "
                                                      "network, for NVLink and NICs alike)")
    collective_latency_s: float = setting(0.0, unit="s", low=0.0, high=1.0,
                                          meaning="fixed latency of every collective over more than one GPU, "
                                                  "besides its log2(n) rounds (the alpha-beta model's base "
                                                  "latency)",
                                          source="0 by default; NCCL's tuning model has a base latency of this "
                                                 "form (src/graph/tuning.cc)")

    sequence_overhead_s: float = setting(
        0.0, unit="s", low=0.0, high=0.01,
        meaning="runtime cost per running sequence per pass on its attention replica (scheduling, input "
                "metadata, sampling, output processing)",
        source="0 by default; vLLM measured up to 20 ms between steps at batch 200 (vllm-project/vllm issue "
               "6801); fitted in the calibrated set")
    attention_memory: float | None = setting(
        None, low=0.0, high=1.0, low_inclusive=False,
        meaning="fraction of HBM bandwidth reached by attention's KV reads and writes (absent: memory)",
        source="absent by default; decode kernels reach 0.25-0.9 of HBM bandwidth by shape (FlashMLA README; "
               "Dao-AILab/flash-attention issue 1572)")
    attention_dp_imbalance: float = setting(
        0.0, low=0.0, high=1.0,
        meaning="part of a mixed pass's prompt chunk beyond an even share that the busiest attention-DP replica "
                "prefills (0: spread evenly over the ep/tp replicas; 1: the whole chunk on one replica)",
        source="0 by default; TensorRT-LLM measured a 54 % mean balance ratio (mean / max tokens per rank) at "
               "attention DP 8 with round-robin scheduling (tech blog 10, ADP Balance Strategy)")

    @property
    def kv_memory(self) -> float:
        """Fraction of HBM bandwidth reached on KV traffic (``attention_memory``, else ``memory``)."""
        return self.memory if self.attention_memory is None else self.attention_memory

    @property
    def scale_out_network(self) -> float:
        """Fraction of the scale-out NIC bandwidth reached (``network_scale_out``, else ``network``)."""
        return self.network if self.network_scale_out is None else self.network_scale_out

    def __post_init__(self) -> None:
        check_fields(self, "efficiency", names=("network_scale_out", "attention_memory", "sequence_overhead_s",
                                                "attention_dp_imbalance", "compute", "memory", "network",
                                                "layer_overhead_s", "scale_up_latency_s", "scale_out_latency_s",
                                                "pass_overhead_s", "collective_latency_s", "routing_locality"),
                     hold=False)


@dataclass(frozen=True)
class Parallelism:
    """TP x PP x EP layout of one worker: ``num_gpus = pp x ep``, ``ep / tp`` attention replicas.

    Parameters
    ----------
    tp : int
        Tensor-parallel width of one attention replica (GPUs, >= 1, dividing ``ep``; default 1).
    pp : int
        Pipeline stages (>= 1, at most the model's layers; default 1).
    ep : int
        GPUs per stage, over which the experts are spread (>= 1, at most the routed experts;
        default 8).
    num_gpus : int, optional
        GPUs of the worker; ``None`` (default) derives pp x ep, a given value must equal it.

    Raises
    ------
    ConfigError
        For a value below 1, ``tp`` not dividing ``ep``, or ``num_gpus`` != pp x ep (fields
        ``parallelism.*``).
    """

    tp: int = setting(1, kind=int, low=1, unit="GPUs", meaning="tensor-parallel width of one attention replica; "
                                                               "must divide ep")
    pp: int = setting(1, kind=int, low=1, unit="stages", meaning="pipeline stages, at most the model's layers")
    ep: int = setting(8, kind=int, low=1, unit="GPUs", meaning="GPUs per stage, over which the experts are spread "
                                                               "(ep/tp attention replicas; ep = tp: no expert "
                                                               "parallelism beyond TP)")
    num_gpus: int | None = setting(None, kind=int, low=1, unit="GPUs",
                                   meaning="GPUs of the worker (absent: pp x ep; a given value must equal it)")

    def __post_init__(self) -> None:
        check_fields(self, "parallelism", names=("tp", "pp", "ep"), hold=False)
        if self.ep % self.tp:
            ep = -(-self.ep // self.tp) * self.tp   # the smallest stage that tp GPUs per replica tile
            raise ConfigError("parallelism.tp", f"tp = {self.tp} with ep = {self.ep} (pp = {self.pp}) is not a "
                              f"layout: ep is the number of GPUs in a stage (the experts are spread over all of "
                              f"them) and attention runs as ep/tp replicas of tp GPUs, so tp must divide ep. "
                              f"The smallest stage of {self.tp}-GPU replicas with at least {self.ep} GPUs is "
                              f"tp = {self.tp}, ep = {ep} (--tp {self.tp} --ep {ep}); tensor parallelism over "
                              f"{self.tp} GPUs with no further expert parallelism is tp = {self.tp}, "
                              f"ep = {self.tp}; one GPU is tp = 1, ep = 1")
        if self.num_gpus is None:
            object.__setattr__(self, "num_gpus", self.pp * self.ep)
        elif self.num_gpus != self.pp * self.ep:
            raise ConfigError("parallelism.num_gpus", f"{self.num_gpus} must equal pp x ep = "
                              f"{self.pp * self.ep}")

    @property
    def dp_attention(self) -> int:
        """Data-parallel attention replicas per stage, ep / tp."""
        return self.ep // self.tp


@dataclass(frozen=True)
class PhaseTime:
    """One phase of a pass over the whole model for one micro-batch, timed by the roofline on the
    ``gpus`` that run it. Times in seconds; ``network_bytes`` is the total over those GPUs, of
    which ``scale_out_bytes`` cross the scale-out network.

    Parameters
    ----------
    phase : str
        ``"attention"``, ``"experts"`` or ``"dense"``.
    flops : float
        Floating-point operations of the phase (FLOP).
    hbm_bytes : float
        HBM traffic summed over ``gpus`` (bytes).
    network_bytes : float
        Link traffic summed over ``gpus`` (bytes): TP all-reduce or expert all-to-all.
    compute_s : float
        Compute time at the efficiency-scaled tensor rate (s).
    memory_s : float
        Memory time at the efficiency-scaled HBM bandwidth (s).
    network_s : float
        Network time at the efficiency-scaled link bandwidth (s).
    gpus : float
        GPUs the phase runs on (default 1).
    scale_out_bytes : float
        Part of ``network_bytes`` over the scale-out NICs (bytes; default 0).
    """

    phase: str
    flops: float
    hbm_bytes: float
    network_bytes: float
    compute_s: float
    memory_s: float
    network_s: float
    gpus: float = 1.0
    scale_out_bytes: float = 0.0

    @property
    def time_s(self) -> float:
        """The phase's roofline time (s): the largest of compute, memory and network time."""
        return max(self.compute_s, self.memory_s, self.network_s)

    @property
    def busy_s(self) -> float:
        """Compute/memory time (what the network can hide behind)."""
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        """Which roof sets the time: ``"compute"``, ``"memory"`` or ``"network"``."""
        t = {"compute": self.compute_s, "memory": self.memory_s, "network": self.network_s}
        return max(t, key=t.get)

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per HBM byte (FLOP/byte; inf without HBM traffic)."""
        return self.flops / self.hbm_bytes if self.hbm_bytes else math.inf

    @property
    def network_bytes_per_s_per_gpu(self) -> float:
        """Network traffic per GPU averaged over the phase (bytes/s)."""
        return self.network_bytes / self.gpus / self.time_s if self.time_s > 0 else 0.0


@dataclass(frozen=True)
class PassTime:
    """A micro-batch's pass through the worker's pipeline: its phases (whole model), the time one
    stage takes for each chunk, the hand-off between stages and what it produced.

    ``time_s`` is the latency of the pass (TPOT for decode, TTFT for a fill): every chunk crosses
    all ``stages``; ``tokens_per_s`` is the worker's steady-state throughput with
    ``microbatches`` such passes in flight.

    Parameters
    ----------
    mode : str
        ``"prefill"``, ``"midfill"`` or ``"decode"``.
    phases : tuple of PhaseTime
        Attention, experts and dense phases over the whole model for one micro-batch (summed over
        chunks for a chunked fill).
    tokens : float
        Tokens the pass processes (new prompt tokens for a fill, one per sequence for decode).
    sequences : float
        Sequences in the micro-batch.
    microbatches : int
        Micro-batches in flight in steady state (>= 1).
    num_gpus : int
        GPUs of the worker.
    stages : int
        Pipeline stages every chunk crosses (default 1).
    stage_times_s : tuple of float
        Time one stage takes for each chunk, fixed costs included (s).
    handoff_s : float
        Hand-off between two stages (s; default 0).
    fixed_s : float
        Fixed per-layer and collective-latency cost within each stage time (s; default 0).
    """

    mode: str
    phases: tuple[PhaseTime, ...]
    tokens: float
    sequences: float
    microbatches: int
    num_gpus: int
    stages: int = 1
    stage_times_s: tuple[float, ...] = ()
    handoff_s: float = 0.0
    fixed_s: float = 0.0

    @property
    def _slots(self) -> tuple[float, ...]:
        return tuple(t + self.handoff_s for t in self.stage_times_s)

    @property
    def time_s(self) -> float:
        """Latency of the pass (s): TPOT for decode, TTFT for a fill (flow-shop makespan)."""
        s = self._slots
        return sum(s) + (self.stages - 1) * max(s)

    @property
    def stage_busy_s(self) -> float:
        """Time one stage spends on this pass (all its chunks, with hand-offs)."""
        return sum(self._slots)

    @property
    def tokens_per_s(self) -> float:
        """Worker throughput: ``microbatches`` passes in flight, at most one per stage at a time."""
        return min(self.microbatches * self.tokens / self.time_s, self.tokens / self.stage_busy_s)

    @property
    def tokens_per_s_per_gpu(self) -> float:
        """Worker throughput per GPU (tokens/s)."""
        return self.tokens_per_s / self.num_gpus

    @property
    def bubble_fraction(self) -> float:
        """Share of time a stage idles in steady state (the pipeline bubble)."""
        return 1.0 - self.tokens_per_s * self.stage_busy_s / self.tokens

    @property
    def overhead_fraction(self) -> float:
        """Share of the stage time spent on fixed per-layer and collective-latency costs."""
        return len(self.stage_times_s) * self.fixed_s / sum(self.stage_times_s)

    @property
    def bound(self) -> str:
        """The roof of the longest phase."""
        return max(self.phases, key=lambda p: p.time_s).bound

    @property
    def network_peak_bytes_per_s_per_gpu(self) -> float:
        """Largest phase-averaged network traffic per GPU (bytes/s), article section 23.4."""
        return max(p.network_bytes_per_s_per_gpu for p in self.phases)

    def phase(self, name: str) -> PhaseTime:
        """The phase called ``name``; raises ``KeyError`` if there is none."""
        for p in self.phases:
            if p.phase == name:
                return p
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """Headline figures and each phase's time (``<phase>_s``) and roof (``<phase>_bound``)."""
        d = {"mode": self.mode, "time_s": self.time_s, "tokens": self.tokens,
             "sequences": self.sequences, "tokens_per_s": self.tokens_per_s,
             "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "bound": self.bound,
             "stages": self.stages, "microbatches": self.microbatches, "handoff_s": self.handoff_s,
             "bubble_fraction": self.bubble_fraction, "overhead_fraction": self.overhead_fraction}
        for p in self.phases:
            d[f"{p.phase}_s"] = p.time_s
            d[f"{p.phase}_bound"] = p.bound
        return d


@dataclass(frozen=True)
class Worker:
    """A model on a set of GPUs with a parallel layout: the unit whose service rates we need.

    ``memory_utilization`` is the usable fraction of HBM (vLLM's ``gpu_memory_utilization``
    default, 0.9); ``working_fraction`` of HBM is reserved for activations, routing buffers and
    KV-transfer staging (an assumption; the article's M_working). ``overlap_communication`` hides
    the network time behind the pass's compute (two-micro-batch overlap, see the module notes).

    Its methods time the four operating modes (:meth:`prefill`, :meth:`midfill`,
    :meth:`decode`) as :class:`PassTime` objects and size its KV (:meth:`decode_slots`).

    Parameters
    ----------
    model : MoEModel
        The model the worker serves.
    accelerator : Accelerator
        The GPU type (per-GPU figures).
    parallelism : Parallelism
        The TP x PP x EP layout (default tp 1, pp 1, ep 8); pp at most the model's layers, ep at
        most its routed experts.
    efficiency : Efficiency
        Fractions of peak reached and fixed costs (default: the fitted values).
    memory_utilization : float
        Usable fraction of HBM, in (0, 1] (default 0.9).
    working_fraction : float
        Fraction of HBM reserved for activations and buffers, in [0, 1) (default 0.05).
    overlap_communication : bool
        Hide network time behind compute (default True).

    Raises
    ------
    ConfigError
        For a value outside its range, a layout the model cannot take, or weights and working
        memory that leave no HBM for KV (field ``parallelism``).
    """

    model: MoEModel
    accelerator: Accelerator
    parallelism: Parallelism = field(default_factory=Parallelism)
    efficiency: Efficiency = field(default_factory=Efficiency)
    memory_utilization: float = 0.9
    working_fraction: float = 0.05
    overlap_communication: bool = True

    def __post_init__(self) -> None:
        check_number("worker.memory_utilization", self.memory_utilization, low=0.0, high=1.0,
                     low_inclusive=False)
        check_number("worker.working_fraction", self.working_fraction, low=0.0, high=1.0,
                     high_inclusive=False)
        if not isinstance(self.overlap_communication, bool):
            raise ConfigError("worker.overlap_communication",
                              f"{self.overlap_communication!r} must be true or false")
        par, m = self.parallelism, self.model
        if par.pp > m.num_layers:
            raise ConfigError("parallelism.pp", f"{par.pp} stages exceed the model's "
                              f"{m.num_layers} layers; allowed range is [1, {m.num_layers}]")
        if par.ep > m.routed_experts and m.moe_layers:
            raise ConfigError("parallelism.ep", f"{par.ep} GPUs per stage exceed the "
                              f"{m.routed_experts} routed experts")
        self.check_fits()

    # -- construction -------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "worker") -> "Worker":
        """Keys: ``model``, ``hardware`` (name, TOML path or table), ``parallelism``,
        ``efficiency``, ``memory_utilization``, ``working_fraction``, ``overlap_communication``.

        Parameters
        ----------
        d : mapping
            The worker table: ``model`` and ``hardware`` (required; preset name, TOML path or
            table), ``parallelism`` and ``efficiency`` (tables of :class:`Parallelism` and
            :class:`Efficiency` fields) and the scalar fields.
        where : str
            Dotted path of the table, used in error messages (default ``"worker"``).

        Returns
        -------
        Worker
            The validated worker.

        Raises
        ------
        ConfigError
            For an unknown or missing key, or any invalid value (including a model that does not
            fit).
        """
        reject_unknown_keys(where, d, {"model", "hardware", "parallelism", "efficiency",
                                       "memory_utilization", "working_fraction",
                                       "overlap_communication"})
        for req in ("model", "hardware"):
            if req not in d:
                raise ConfigError(f"{where}.{req}", "missing")
        par = dict(d.get("parallelism", {}))
        reject_unknown_keys(f"{where}.parallelism", par, {f.name for f in dataclasses.fields(Parallelism)})
        eff = dict(d.get("efficiency", {}))
        reject_unknown_keys(f"{where}.efficiency", eff, {f.name for f in dataclasses.fields(Efficiency)})
        kw = {k: d[k] for k in ("memory_utilization", "working_fraction", "overlap_communication")
              if k in d}
        return cls(model=load_model(d["model"]), accelerator=load_accelerator(d["hardware"]),
                   parallelism=Parallelism(**par), efficiency=Efficiency(**eff), **kw)

    # -- memory -------------------------------------------------------------------------
    @property
    def num_gpus(self) -> int:
        return self.parallelism.num_gpus

    @functools.cached_property  # a frozen worker: computed once
    def _kv_replication(self) -> float:
        """Copies of each KV byte across the TP ranks of an attention replica."""
        a, tp = self.model.attention, self.parallelism.tp
        return float(tp) if a.kind == "mla" else tp / min(tp, a.kv_heads)

    @functools.cached_property  # a frozen worker: computed once
    def non_expert_bytes(self) -> float:
        """Weights every token touches (attention, dense FFN, routers, embeddings, shared experts)."""
        m = self.model
        shared = m.moe_layers * m.shared_experts * m.expert_weight_bytes
        return m.non_expert_params * m.weight_bytes_per_param + shared

    @functools.cached_property  # a frozen worker: computed once
    def weight_bytes_per_gpu(self) -> float:
        p = self.parallelism
        return self.non_expert_bytes / (p.tp * p.pp) + self.model.routed_expert_weight_bytes / (p.ep * p.pp)

    @property
    def usable_bytes_per_gpu(self) -> float:
        return self.accelerator.hbm_bytes * self.memory_utilization

    @property
    def working_bytes_per_gpu(self) -> float:
        return self.accelerator.hbm_bytes * self.working_fraction

    @functools.cached_property  # a frozen worker: computed once
    def kv_bytes_per_gpu(self) -> float:
        """HBM left for KV after weights and working memory."""
        return self.usable_bytes_per_gpu - self.weight_bytes_per_gpu - self.working_bytes_per_gpu

    def check_fits(self) -> None:
        """Raise :class:`ConfigError` when weights and working memory leave no room for KV."""
        if self.kv_bytes_per_gpu <= 0:
            p = self.parallelism
            raise ConfigError(
                "parallelism",
                f"{self.model.name} does not fit on {self.accelerator.name} at tp={p.tp} pp={p.pp} "
                f"ep={p.ep}: {self.weight_bytes_per_gpu / 1e9:.1f} GB weights + "
                f"{self.working_bytes_per_gpu / 1e9:.1f} GB working memory per GPU exceed the "
                f"usable {self.usable_bytes_per_gpu / 1e9:.1f} GB; {self._fit_hint()}, or use a GPU "
                "with more HBM")

    def _fit_hint(self) -> str:
        """Which layout knob shrinks the larger part of the weights per GPU: the non-expert weights
        split over tp x pp (every attention replica holds a copy), the routed experts over ep x pp."""
        p, m = self.parallelism, self.model
        non_expert = self.non_expert_bytes / (p.tp * p.pp)
        experts = m.routed_expert_weight_bytes / (p.ep * p.pp)
        if non_expert >= experts:
            return (f"raise tp (with ep a multiple of it) or pp: {non_expert / 1e9:.1f} GB of it are "
                    f"non-expert weights, split over tp x pp (each of the ep/tp = {p.ep // p.tp} attention "
                    "replicas holds a copy)")
        return f"raise ep or pp: {experts / 1e9:.1f} GB of it are routed experts, split over ep x pp"

    @functools.cached_property  # a frozen worker: computed once
    def kv_capacity_bytes(self) -> float:
        """Distinct KV bytes the worker can hold (replicas over TP ranks counted once)."""
        return self.kv_bytes_per_gpu * self.num_gpus / self._kv_replication

    @property
    def kv_capacity_tokens(self) -> float:
        return self.kv_capacity_bytes / self.model.kv_bytes_per_token

    def decode_slots(self, context_tokens: float) -> int:
        """Most sequences of ``context_tokens`` whose KV fits in the worker at once.

        Parameters
        ----------
        context_tokens : float
            Context per sequence (tokens, >= 1).

        Returns
        -------
        int
            floor(KV capacity bytes / KV bytes of one sequence).

        Raises
        ------
        ConfigError
            For ``context_tokens`` below 1.
        """
        check_number("context_tokens", context_tokens, low=1.0)
        return int(self.kv_capacity_bytes // self.model.kv_bytes(context_tokens))

    def resident_bytes_per_gpu(self, sequences: float, context_tokens: float,
                               tokens_in_flight: float = 0.0) -> float:
        """HBM a GPU actually holds serving ``sequences`` of ``context_tokens``: its weights, its
        share of their KV (with TP replication) and the activations of ``tokens_in_flight``
        (input, output, dispatch and combine buffers of hidden size). Buffers for KV moving in or
        out of the worker are excluded, as in the article's section 23.3."""
        m = self.model
        kv = sequences * m.kv_bytes(context_tokens) * self._kv_replication / self.num_gpus
        act = 4.0 * tokens_in_flight * m.hidden_size * m.activation_bytes_per_element / self.num_gpus
        return self.weight_bytes_per_gpu + kv + act

    def energy_per_token_j(self, p: PassTime) -> float:
        """Joules per token at board power on every GPU of the worker (``power_watts``)."""
        return self.accelerator.power_watts * self.num_gpus / p.tokens_per_s

    # -- links --------------------------------------------------------------------------
    def _link(self, span: int) -> tuple[float, float]:
        """(bandwidth per direction, round latency) of a group of ``span`` GPUs."""
        a, e = self.accelerator, self.efficiency
        if span <= a.scale_up_domain:
            return a.scale_up_bandwidth, e.scale_up_latency_s
        return a.scale_out_bandwidth, e.scale_out_latency_s

    def _all_to_all_bytes(self, tokens: float, per_node_dedup: bool) -> tuple[float, float]:
        """(NVLink bytes, scale-out bytes) of dispatch + combine for ``tokens`` over a stage."""
        m, p, a = self.model, self.parallelism, self.accelerator
        if p.ep == 1:
            return 0.0, 0.0
        k = m.active_experts
        dispatch = min(PRECISIONS[m.expert_activation_precision or m.expert_precision], m.activation_bytes_per_element)
        per_copy = m.moe_layers * m.hidden_size * (dispatch + m.activation_bytes_per_element)
        if p.ep <= a.scale_up_domain:
            return tokens * k * (p.ep - 1) / p.ep * per_copy, 0.0
        nodes = p.ep / a.scale_up_domain
        g = p.ep / nodes
        local = k * (g - 1) / p.ep
        remote = k * (p.ep - g) / p.ep
        if per_node_dedup:  # one RDMA copy per destination node, forwarded over NVLink there
            out = (nodes - 1) * (1.0 - (1.0 - 1.0 / nodes) ** k)
            up = local + remote * (g - 1) / g
        else:               # one RDMA copy per remote expert
            out, up = remote, local
        return tokens * up * per_copy, tokens * out * per_copy

    # -- phases -------------------------------------------------------------------------
    def mma_precision(self, weight_precision: str, activation_precision: str | None = None) -> str:
        """The number format a GEMM of ``weight_precision`` weights and ``activation_precision``
        inputs multiplies in on this GPU: the wider of the two (``None``: the weights', as W8A8
        and W4A4 recipes quantise both); FP4 weights with wider inputs on a GPU without FP4 tensor
        cores are dequantised in the kernel and multiply at BF16 (TensorRT-LLM's gpt-oss MoE
        support matrix: Hopper runs MXFP4 weights with BF16 activations on HGMMA, FP8 x MXFP4 is
        not enabled; Blackwell multiplies MXFP8 x MXFP4 natively).

        Parameters
        ----------
        weight_precision : str
            The weights' format, a key of ``PRECISIONS``.
        activation_precision : str, optional
            The inputs' format; ``None`` (default) is ``weight_precision``.

        Returns
        -------
        str
            A key of ``PRECISIONS`` whose tensor rate (:meth:`Accelerator.peak_flops`) the GEMM runs at.
        """
        if activation_precision is None or activation_precision == weight_precision:
            return weight_precision
        if PRECISIONS[activation_precision] > PRECISIONS[weight_precision]:
            if weight_precision == "fp4" and "fp4" not in self.accelerator.dense_flops:
                return "bf16"
            return activation_precision
        return weight_precision

    @property
    def expert_mma_precision(self) -> str:
        """The format the expert GEMMs multiply in (:meth:`mma_precision` of the model's
        ``expert_precision`` and ``expert_activation_precision``)."""
        m = self.model
        return self.mma_precision(m.expert_precision, m.expert_activation_precision)

    def _phase(self, name: str, flops: float, hbm_bytes: float, gpus: float, *,
               precision: str | None = None, kv_flops: float = 0.0, kv_bytes: float = 0.0,
               up_bytes: float = 0.0, out_bytes: float = 0.0, span: int | None = None) -> PhaseTime:
        """Roofline one phase on ``gpus``. ``flops`` run at ``precision``'s tensor rate (default
        the weights'), ``kv_flops`` (attention scores and values over the cache) at the KV
        precision's rate; ``kv_bytes`` (KV-cache traffic, part of ``hbm_bytes``) move at the KV
        bandwidth efficiency (``Efficiency.kv_memory``); ``up_bytes`` cross the scale-up fabric, ``out_bytes`` the scale-out
        NICs (a group wider than the domain, ``span`` GPUs, sends everything scale-out)."""
        a, e, m = self.accelerator, self.efficiency, self.model
        compute_s = (flops / a.peak_flops(precision or m.weight_precision)
                     + kv_flops / a.peak_flops(m.kv_precision)) / (gpus * e.compute)
        if e.attention_memory is None:  # one efficiency for all HBM traffic (the defaults' form, exactly)
            memory_s = hbm_bytes / (gpus * a.hbm_bandwidth * e.memory)
        else:
            memory_s = ((hbm_bytes - kv_bytes) / e.memory + kv_bytes / e.kv_memory) / (gpus * a.hbm_bandwidth)
        if span is not None and span > a.scale_up_domain:
            up_bytes, out_bytes = 0.0, up_bytes + out_bytes
        network_s = max(up_bytes / (gpus * a.scale_up_bandwidth * e.network),
                        out_bytes / (gpus * a.scale_out_bandwidth * e.scale_out_network))
        return PhaseTime(name, flops + kv_flops, hbm_bytes, up_bytes + out_bytes, compute_s,
                         memory_s, network_s, gpus, out_bytes)

    def _attention_phase(self, sequences: float, new_tokens: float, cached_tokens: float) -> PhaseTime:
        """Attention over a micro-batch of ``sequences``, each adding ``new_tokens`` after
        ``cached_tokens``; timed on the busiest attention replica (tp GPUs)."""
        m, p = self.model, self.parallelism
        per_replica = math.ceil(sequences / p.dp_attention) if sequences else 0
        q_tokens = per_replica * new_tokens
        # Causal attention: new token i of a sequence attends cached + i tokens (a local layer at
        # most its window).
        absorbed = new_tokens == 1  # MLA: absorbed form in decode, expanded form in fill
        flops = 2.0 * q_tokens * m.num_layers * m.attention_params_per_layer
        kv_flops = per_replica * m.causal_attention_core_flops(new_tokens, cached_tokens, absorbed)
        if not absorbed and cached_tokens:
            kv_flops += per_replica * m.full_attention_layers * m.attention.latent_expansion_flops(cached_tokens)
        act = m.activation_bytes_per_element * m.hidden_size
        kv_read = per_replica * (m.kv_bytes(cached_tokens) if cached_tokens else 0.0)
        kv_write = per_replica * new_tokens * m.kv_bytes_per_token
        kv = self._kv_replication * (kv_read + kv_write)
        hbm = (m.num_layers * m.attention_params_per_layer * m.weight_bytes_per_param
               + kv + 2 * q_tokens * act * m.num_layers)
        # TP: one ring all-reduce of the attention output per layer, 2 (tp-1)/tp of it per GPU.
        allreduce = 2.0 * (p.tp - 1) * q_tokens * act * m.num_layers
        return self._phase("attention", flops, hbm, p.tp, kv_flops=kv_flops, kv_bytes=kv, up_bytes=allreduce,
                           span=p.tp)

    def _expert_phase(self, tokens: float, per_node_dedup: bool = False) -> PhaseTime:
        """Routed + shared experts for ``tokens`` tokens of one micro-batch over a stage's GPUs."""
        m, p = self.model, self.parallelism
        # routing locality l: B tokens read the distinct experts of 1 + l (B - 1) independent ones
        loc = self.efficiency.routing_locality
        eff_tokens = min(tokens, 1.0 + loc * (tokens - 1.0)) if tokens > 1 else tokens
        per_layer_distinct = distinct_experts(m.routed_experts, m.active_experts, eff_tokens)
        # Balanced placement, but the busiest GPU holds at least one active expert per layer.
        per_gpu_experts = max(per_layer_distinct / p.ep, min(per_layer_distinct, 1.0))
        act = m.activation_bytes_per_element * m.hidden_size
        routed = tokens * m.active_experts
        flops = 2.0 * m.moe_layers * m.expert_params * tokens * (m.active_experts + m.shared_experts)
        hbm_per_gpu = m.moe_layers * (per_gpu_experts * m.expert_weight_bytes
                                      + (m.shared_experts * m.expert_weight_bytes) / p.tp)
        hbm_per_gpu += m.moe_layers * 2 * routed * act / p.ep
        up, out = self._all_to_all_bytes(tokens, per_node_dedup)
        return self._phase("experts", flops, hbm_per_gpu * p.ep, p.ep, precision=self.expert_mma_precision,
                           up_bytes=up, out_bytes=out)

    def _dense_phase(self, tokens: float, sequences: float) -> PhaseTime:
        """Dense FFN layers, routers and embeddings/LM head (LM head only for new outputs)."""
        m, p = self.model, self.parallelism
        replicas = min(p.dp_attention, max(sequences, 1))
        dense = m.num_dense_layers * m.dense_ffn_params + m.moe_layers * m.router_params
        head = m.vocab_size * m.hidden_size
        flops = 2.0 * tokens * dense + 2.0 * sequences * head
        hbm = replicas * (dense + m.embedding_params) * m.weight_bytes_per_param
        # a dense FFN layer is sharded over an attention replica's tp GPUs (its weights are, see
        # weight_bytes_per_gpu): one ring all-reduce of its output per layer, as after attention
        act = m.activation_bytes_per_element * m.hidden_size
        allreduce = 2.0 * (p.tp - 1) * (tokens / p.dp_attention) * act * m.num_dense_layers
        return self._phase("dense", flops, hbm, p.ep, up_bytes=allreduce * p.dp_attention, span=p.tp)

    def _collective_alpha_s(self, participants: int) -> float:
        """Latency (alpha) of one collective over ``participants`` GPUs: the fixed
        ``collective_latency_s`` plus ``ceil(log2 n)`` rounds on its link (0 for one GPU)."""
        if participants <= 1:
            return 0.0
        return self.efficiency.collective_latency_s + collective_rounds(participants) * self._link(participants)[1]

    @functools.cached_property  # a frozen worker: computed once
    def collective_latency_s(self) -> float:
        """Latency of the collectives of one pass over the whole model: two all-to-alls
        (dispatch, combine) per MoE layer over ``ep`` GPUs, and over ``tp`` GPUs one all-reduce per
        layer after attention and one after each dense FFN layer (tensor-parallel MLP)."""
        m, p = self.model, self.parallelism
        a2a = 2 * m.moe_layers * self._collective_alpha_s(p.ep)
        ar = (m.num_layers + m.num_dense_layers) * self._collective_alpha_s(p.tp)
        return a2a + ar

    @functools.cached_property  # a frozen worker: computed once
    def fixed_stage_s(self) -> float:
        """Fixed time of one stage pass: its layers' overhead and collective latency."""
        e, p = self.efficiency, self.parallelism
        return (self.model.num_layers * e.layer_overhead_s + self.collective_latency_s) / p.pp \
            + e.pass_overhead_s

    def handoff_s(self, tokens: float) -> float:
        """Hand-off of a micro-batch of ``tokens`` between two stages: one link latency plus its
        activations, sent by the stage's ``ep`` GPUs (0 without pipelining)."""
        p, m = self.parallelism, self.model
        if p.pp == 1:
            return 0.0
        bw, lat = self._link(p.pp * p.ep)
        e = self.efficiency
        eff = e.network if p.pp * p.ep <= self.accelerator.scale_up_domain else e.scale_out_network
        return lat + tokens * m.hidden_size * m.activation_bytes_per_element / (p.ep * bw * eff)

    def sequence_overhead_s(self, sequences: float) -> float:
        """Runtime cost of a pass over ``sequences`` of one micro-batch (a decode or mixed pass's
        decodes, a fill's prompts): ``Efficiency.sequence_overhead_s`` per sequence on the busiest
        attention replica (ceil(sequences / (ep / tp))), paid once per token; 0 by default.

        Parameters
        ----------
        sequences : float
            Sequences of the micro-batch on the worker (>= 0).

        Returns
        -------
        float
            Seconds added to the pass (a stage carries 1/pp of it).
        """
        c = self.efficiency.sequence_overhead_s
        if not c or sequences <= 0:
            return 0.0
        return c * math.ceil(sequences / self.parallelism.dp_attention)

    def _stage_time(self, phases: tuple[PhaseTime, ...], sequences: float = 0.0) -> float:
        """Time one stage takes for its 1/pp share of the phases' work and of the per-sequence
        runtime cost of ``sequences``, plus its fixed costs."""
        if self.overlap_communication:
            work = max(sum(p.busy_s for p in phases), sum(p.network_s for p in phases))
        else:
            work = sum(p.time_s for p in phases)
        return (work + self.sequence_overhead_s(sequences)) / self.parallelism.pp + self.fixed_stage_s

    def _phases(self, sequences: float, new_tokens: float, cached_tokens: float,
                output_sequences: float) -> tuple[PhaseTime, ...]:
        tokens = sequences * new_tokens
        return (self._attention_phase(sequences, new_tokens, cached_tokens),
                self._expert_phase(tokens, per_node_dedup=new_tokens > 1),
                self._dense_phase(tokens, output_sequences))

    # -- the four operating modes --------------------------------------------------------
    def prefill(self, new_tokens: int, sequences: int = 1, chunks: int = 1) -> PassTime:
        """Prefill of ``sequences`` prompts of ``new_tokens`` each, no cached prefix (per micro-batch)."""
        return self.midfill(new_tokens, 0, sequences, chunks)

    def midfill(self, new_tokens: int, cached_tokens: int, sequences: int = 1,
                chunks: int = 1) -> PassTime:
        """``new_tokens`` appended to ``cached_tokens`` of cached KV (read once), per sequence.

        With ``chunks > 1`` each prompt is cut into that many equal chunks that follow each other
        through the pipeline stages, chunk j attending the cache plus the j chunks before it;
        ``time_s`` is then the flow-shop makespan (TTFT) and the throughput that of a full pipeline.

        Parameters
        ----------
        new_tokens : int
            Prompt tokens added per sequence (>= 1).
        cached_tokens : int
            Tokens already in the KV cache per sequence (>= 0; 0 is a prefill).
        sequences : int
            Sequences in the micro-batch (>= 1; default 1).
        chunks : int
            Chunks each prompt is cut into, in [1, ``new_tokens``] (default 1).

        Returns
        -------
        PassTime
            Mode ``"midfill"`` (or ``"prefill"`` without a cache); ``time_s`` is the TTFT (s),
            ``tokens_per_s`` the worker's fill throughput with ``pp`` passes in flight.

        Raises
        ------
        ConfigError
            For a value outside its range.
        """
        check_number("new_tokens", new_tokens, low=1.0)
        check_number("cached_tokens", cached_tokens, low=0.0)
        check_number("sequences", sequences, low=1.0)
        check_int("chunks", chunks, low=1, high=int(new_tokens))
        mode = "midfill" if cached_tokens > 0 else "prefill"
        size = new_tokens / chunks
        stage_times, phases = [], None
        for j in range(chunks):
            last = j == chunks - 1
            ph = self._phases(sequences, size, cached_tokens + j * size, sequences if last else 0)
            stage_times.append(self._stage_time(ph, sequences))
            phases = ph if phases is None else tuple(
                dataclasses.replace(a, flops=a.flops + b.flops, hbm_bytes=a.hbm_bytes + b.hbm_bytes,
                                    network_bytes=a.network_bytes + b.network_bytes,
                                    compute_s=a.compute_s + b.compute_s, memory_s=a.memory_s + b.memory_s,
                                    network_s=a.network_s + b.network_s,
                                    scale_out_bytes=a.scale_out_bytes + b.scale_out_bytes)
                for a, b in zip(phases, ph))
        p = self.parallelism
        return PassTime(mode, phases, sequences * new_tokens, sequences, p.pp, self.num_gpus,
                        p.pp, tuple(stage_times), self.handoff_s(sequences * size), self.fixed_stage_s)

    def decode(self, batch: int, context_tokens: int, check_memory: bool = True,
               microbatches: int | None = None) -> PassTime:
        """One decode pass: ``batch`` sequences on the worker, each at ``context_tokens``.

        The batch is split into ``microbatches`` (default ``min(pp, batch)``) micro-batches that
        circulate through the stages; the pass time is the TPOT. With ``check_memory`` off, a
        batch whose KV would not fit is timed anyway (for tables).

        Parameters
        ----------
        batch : int
            Sequences decoding on the worker (>= 1; at most :meth:`decode_slots` when
            ``check_memory``).
        context_tokens : int
            Context per sequence (tokens, >= 0).
        check_memory : bool
            Reject a batch whose KV does not fit (default True).
        microbatches : int, optional
            Micro-batches in flight, in [1, ``batch``]; ``None`` (default) is min(pp, batch).

        Returns
        -------
        PassTime
            Mode ``"decode"``; ``time_s`` is the TPOT (s) and ``tokens_per_s`` the worker's
            output tokens/s.

        Raises
        ------
        ConfigError
            For a value outside its range or (field ``batch``) more sequences than fit.
        """
        check_number("batch", batch, low=1.0)
        check_number("context_tokens", context_tokens, low=0.0)
        slots = self.decode_slots(max(context_tokens, 1)) if check_memory else batch
        if batch > slots:
            raise ConfigError("batch", f"{batch} sequences at {context_tokens} tokens need more KV "
                              f"than the worker holds; allowed range is [1, {slots}]")
        p = self.parallelism
        if microbatches is None:
            microbatches = int(min(p.pp, max(1, math.floor(batch))))
        check_int("microbatches", microbatches, low=1, high=max(1, int(batch)))
        micro = batch / microbatches
        ph = self._phases(micro, 1, context_tokens, micro)
        return PassTime("decode", ph, micro, micro, microbatches, self.num_gpus, p.pp,
                        (self._stage_time(ph, micro),), self.handoff_s(micro), self.fixed_stage_s)

    def _mixed_attention_phase(self, decode_sequences: float, context_tokens: float,
                               chunk_tokens: float) -> PhaseTime:
        """Attention of a pass that decodes ``decode_sequences`` at ``context_tokens`` and
        prefills ``chunk_tokens`` (no cached prefix); timed on the busiest replica (its decodes
        plus its piece, :meth:`busiest_chunk_tokens`), attention weights read once."""
        m, p = self.model, self.parallelism
        per_replica = math.ceil(decode_sequences / p.dp_attention) if decode_sequences else 0
        piece = self.busiest_chunk_tokens(chunk_tokens)
        q_tokens = per_replica + piece
        flops = 2.0 * q_tokens * m.num_layers * m.attention_params_per_layer
        kv_flops = per_replica * m.attention_core_flops(1, context_tokens + 1.0, True)
        if piece:
            kv_flops += m.causal_attention_core_flops(piece, 0.0, False)
        act = m.activation_bytes_per_element * m.hidden_size
        kv_read = per_replica * (m.kv_bytes(context_tokens) if context_tokens else 0.0)
        kv_write = (per_replica + piece) * m.kv_bytes_per_token
        kv = self._kv_replication * (kv_read + kv_write)
        hbm = (m.num_layers * m.attention_params_per_layer * m.weight_bytes_per_param
               + kv + 2 * q_tokens * act * m.num_layers)
        allreduce = 2.0 * (p.tp - 1) * q_tokens * act * m.num_layers
        return self._phase("attention", flops, hbm, p.tp, kv_flops=kv_flops, kv_bytes=kv, up_bytes=allreduce,
                           span=p.tp)

    def busiest_chunk_tokens(self, chunk_tokens: float) -> float:
        """Prompt tokens of a mixed pass's chunk that its busiest attention replica prefills:
        ``C / D + u C (1 - 1 / D)`` for a chunk of ``C`` tokens over ``D = ep / tp`` replicas and
        ``u = Efficiency.attention_dp_imbalance`` (``C / D`` by default: spread evenly).

        Parameters
        ----------
        chunk_tokens : float
            New prompt tokens in the pass on one micro-batch (>= 0).

        Returns
        -------
        float
            Tokens, in [C / D, C].
        """
        d, u = self.parallelism.dp_attention, self.efficiency.attention_dp_imbalance
        even = chunk_tokens / d
        if not u or d == 1:  # the defaults' form, exactly
            return even
        return even + u * (chunk_tokens - even)

    def mixed(self, batch: float, context_tokens: float, chunk_tokens: float) -> PassTime:
        """One pass of an aggregated worker: ``batch`` decodes at ``context_tokens`` each generate
        a token while ``chunk_tokens`` new prompt tokens are prefilled in the same pass (chunked
        prefill sharing the pass, as vLLM and SGLang run it; Sarathi-Serve's stall-free batching).

        The chunk has no cached prefix and is spread over the attention replicas as a fill step
        is, or with attention DP concentrated on the busiest replica by
        ``Efficiency.attention_dp_imbalance`` (:meth:`busiest_chunk_tokens`); attention does both parts on the replicas (FLOPs and KV traffic add, attention weights
        are read once, compute and memory overlap inside the phase); experts and dense layers see
        the decodes' and the chunk's tokens together, so the expert weights a decode pass reads
        serve the chunk as well (the shared expert set of the article's section 19). The decode
        micro-batching of :meth:`decode` holds, with the chunk split evenly over the
        micro-batches; ``time_s`` is the decodes' TPOT, which grows with the chunk (the
        interference aggregation pays). ``chunk_tokens = 0`` gives :meth:`decode` exactly.

        Parameters
        ----------
        batch : float
            Decoding sequences in the pass (>= 1).
        context_tokens : float
            Their context (tokens, >= 0).
        chunk_tokens : float
            New prompt tokens prefilled in the pass (>= 0).

        Returns
        -------
        PassTime
            Mode ``"mixed"`` (``"decode"`` for an empty chunk); KV fit is not checked.
        """
        check_number("batch", batch, low=1.0)
        check_number("context_tokens", context_tokens, low=0.0)
        check_number("chunk_tokens", chunk_tokens, low=0.0)
        if not chunk_tokens:
            return self.decode(batch, context_tokens, check_memory=False)
        p = self.parallelism
        microbatches = int(min(p.pp, max(1, math.floor(batch))))
        micro, piece = batch / microbatches, chunk_tokens / microbatches
        tokens = micro + piece
        # dense FFN layers and routers run on each attention replica's own tokens (sharded over its
        # tp GPUs), so with attention-DP imbalance the busiest replica's chunk sets their time too:
        # timed as the even spread of D x its piece (the defaults' form exactly without imbalance)
        dense_tokens = tokens
        if self.efficiency.attention_dp_imbalance and p.dp_attention > 1:
            dense_tokens = micro + p.dp_attention * self.busiest_chunk_tokens(piece)
        ph = (self._mixed_attention_phase(micro, context_tokens, piece),
              self._expert_phase(tokens, per_node_dedup=True),
              self._dense_phase(dense_tokens, micro + p.dp_attention))
        return PassTime("mixed", ph, tokens, micro, microbatches, self.num_gpus, p.pp,
                        (self._stage_time(ph, micro),), self.handoff_s(tokens), self.fixed_stage_s)

    def decode_attention(self, batch: int, context_tokens: int) -> PhaseTime:
        """The attention phase of a decode pass (KV reads private to each sequence)."""
        return self.decode(batch, context_tokens).phase("attention")

    def decode_experts(self, batch: int) -> PhaseTime:
        """The expert phase of a decode pass: distinct experts touched by ``batch`` tokens."""
        check_number("batch", batch, low=1.0)
        return self._expert_phase(batch / min(self.parallelism.pp, max(1, math.floor(batch))))


def decode_sweep(worker: Worker, batches, contexts) -> pd.DataFrame:
    """Decode pass time and throughput over batch sizes and contexts; one row per feasible point.

    Points whose KV does not fit (batch above the worker's decode slots at that context) are
    skipped.

    Parameters
    ----------
    worker : Worker
        The decode worker.
    batches : iterable of int
        Batch sizes (sequences on the worker, >= 1).
    contexts : iterable of int
        Context lengths per sequence (tokens, >= 1).

    Returns
    -------
    pandas.DataFrame
        One row per feasible (context, batch): ``hardware``, ``model``, ``context_tokens``,
        ``batch``, ``step_s`` (pass time = TPOT, s), ``tokens_per_s_per_gpu``, ``attention_s``,
        ``experts_s``, ``dense_s`` (phase times, s), ``bound``, ``overhead_fraction`` and
        ``decode_slots``.
    """
    rows = []
    for c in contexts:
        slots = worker.decode_slots(c)
        for b in batches:
            if b > slots:
                continue
            r = worker.decode(b, c)
            rows.append({"hardware": worker.accelerator.name, "model": worker.model.name,
                         "context_tokens": c, "batch": b, "step_s": r.time_s,
                         "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu,
                         "attention_s": r.phase("attention").time_s,
                         "experts_s": r.phase("experts").time_s,
                         "dense_s": r.phase("dense").time_s, "bound": r.bound,
                         "overhead_fraction": r.overhead_fraction,
                         "decode_slots": slots})
    return pd.DataFrame(rows)
