"""Roofline service model of a worker in the four operating modes (article sections 3, 15, 16).

A *worker* is a group of GPUs holding one model replica: ``pp`` pipeline stages of ``ep`` GPUs
each; in a stage, experts are spread over all ``ep`` GPUs (expert parallelism) and attention runs
as ``ep / tp`` data-parallel replicas of ``tp`` GPUs each (DP attention, as DeepSeek deploys MLA).

Every phase of a forward pass is timed as a roofline,

    t = max(FLOPs / (peak x eff_compute), bytes / (HBM bw x eff_memory), a2a / (link bw x eff_net))

and a pass is the sum of its phases: attention, experts, dense (dense FFN layers, routers,
embeddings). With ``pp`` stages the worker keeps ``pp`` micro-batches in flight, so a pass over a
micro-batch of ``b`` items takes the whole-model time on one stage's GPUs and the worker delivers
``pp x b`` items per pass. TPOT of decode equals the pass time.

Modelled simplifications, stated so users can judge them: experts are balanced over the GPUs of a
stage (the busiest GPU holds at least one active expert per layer); MLA's latent KV is replicated
over TP ranks (each rank reads all of it), GQA's KV is sharded over min(tp, kv_heads); activation
and KV-write traffic is counted, kernel launch cost is one optional fixed term per pass.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tokenfactory.plant_models.hardware import Accelerator, load_accelerator
from tokenfactory.plant_models.moe_model import MoEModel, load_model
from tokenfactory.validation import ConfigError, check_int, check_number, reject_unknown_keys

__all__ = [
    "Efficiency",
    "Parallelism",
    "PhaseTime",
    "PassTime",
    "Worker",
    "ServiceRates",
    "roofline_time",
    "distinct_experts",
    "expert_arithmetic_intensity",
    "decode_sweep",
]


def roofline_time(flops: float, bytes_moved: float, peak_flops: float, bandwidth: float) -> float:
    """max(FLOPs / peak, bytes / bandwidth): the roofline time of one kernel."""
    return max(flops / peak_flops, bytes_moved / bandwidth)


def distinct_experts(routed_experts: int, active_experts: int, tokens: float) -> float:
    """Expected distinct experts one layer touches for ``tokens`` routed tokens.

    Each token picks ``k`` of ``E`` experts; with uniform routing an expert is missed by one token
    with probability 1 - k/E, so E[distinct] = E (1 - (1 - k/E)^B)  (article section 16).
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
    """
    n = np.asarray(n_tokens, dtype=float)
    return 2.0 * n * weights / (weight_bytes + n * activation_bytes + n * output_bytes_per_token)


@dataclass(frozen=True)
class Efficiency:
    """Fractions of peak a real kernel reaches. Defaults are engineering assumptions, not
    measurements: large FP8 GEMMs on Hopper/Blackwell reach ~60 % of dense peak; streaming HBM
    reads ~80 % of nominal bandwidth; NVLink all-to-all ~70 % of per-direction bandwidth.
    ``pass_overhead_s`` is a fixed launch/synchronisation cost per forward pass (0 by default)."""

    compute: float = 0.6
    memory: float = 0.8
    network: float = 0.7
    pass_overhead_s: float = 0.0

    def __post_init__(self) -> None:
        for f in ("compute", "memory", "network"):
            check_number(f"efficiency.{f}", getattr(self, f), low=0.0, high=1.0, low_inclusive=False)
        check_number("efficiency.pass_overhead_s", self.pass_overhead_s, low=0.0)


@dataclass(frozen=True)
class Parallelism:
    """TP x PP x EP layout of one worker: ``num_gpus = pp x ep``, ``ep / tp`` attention replicas."""

    tp: int = 1
    pp: int = 1
    ep: int = 8
    num_gpus: int | None = None

    def __post_init__(self) -> None:
        check_int("parallelism.tp", self.tp, low=1)
        check_int("parallelism.pp", self.pp, low=1)
        check_int("parallelism.ep", self.ep, low=1)
        if self.ep % self.tp:
            raise ConfigError("parallelism.tp", f"tp = {self.tp} must divide ep = {self.ep} "
                              "(attention replicas of tp GPUs tile the stage)")
        if self.num_gpus is None:
            object.__setattr__(self, "num_gpus", self.pp * self.ep)
        elif self.num_gpus != self.pp * self.ep:
            raise ConfigError("parallelism.num_gpus", f"{self.num_gpus} must equal pp x ep = "
                              f"{self.pp * self.ep}")

    @property
    def dp_attention(self) -> int:
        return self.ep // self.tp


@dataclass(frozen=True)
class PhaseTime:
    """One phase of a pass, timed by the roofline. Times in seconds."""

    phase: str
    flops: float
    hbm_bytes: float
    network_bytes: float
    compute_s: float
    memory_s: float
    network_s: float

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s, self.network_s)

    @property
    def bound(self) -> str:
        """Which roof sets the time: ``"compute"``, ``"memory"`` or ``"network"``."""
        t = {"compute": self.compute_s, "memory": self.memory_s, "network": self.network_s}
        return max(t, key=t.get)

    @property
    def arithmetic_intensity(self) -> float:
        return self.flops / self.hbm_bytes if self.hbm_bytes else math.inf


@dataclass(frozen=True)
class PassTime:
    """A forward pass over one micro-batch: its phases, its time, what it produced."""

    mode: str
    phases: tuple[PhaseTime, ...]
    tokens: float
    sequences: float
    overhead_s: float
    microbatches: int
    num_gpus: int

    @property
    def time_s(self) -> float:
        return sum(p.time_s for p in self.phases) + self.overhead_s

    @property
    def tokens_per_s(self) -> float:
        """Worker throughput: ``microbatches`` micro-batches complete per pass time."""
        return self.microbatches * self.tokens / self.time_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.num_gpus

    @property
    def bound(self) -> str:
        """The roof of the longest phase."""
        return max(self.phases, key=lambda p: p.time_s).bound

    def phase(self, name: str) -> PhaseTime:
        for p in self.phases:
            if p.phase == name:
                return p
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        d = {"mode": self.mode, "time_s": self.time_s, "tokens": self.tokens,
             "sequences": self.sequences, "tokens_per_s": self.tokens_per_s,
             "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "bound": self.bound}
        for p in self.phases:
            d[f"{p.phase}_s"] = p.time_s
            d[f"{p.phase}_bound"] = p.bound
        return d


@dataclass(frozen=True)
class ServiceRates:
    """What a plant model needs from one worker at a nominal request shape (SI units)."""

    fill_seconds: float            # one fill pass (one prompt per attention replica), seconds
    fill_tokens_per_s: float       # worker fill throughput, new tokens/s
    decode_step_s: float           # one decode pass at the nominal batch (= TPOT)
    decode_batch: int              # sequences decoded concurrently per worker
    decode_slots: int              # most sequences whose KV fits at the nominal context
    decode_tokens_per_s: float     # worker decode throughput, tokens/s
    kv_bytes_per_request: float    # KV blob produced by one fill
    num_gpus: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Worker:
    """A model on a set of GPUs with a parallel layout: the unit whose service rates we need.

    ``memory_utilization`` is the usable fraction of HBM (vLLM's ``gpu_memory_utilization``
    default, 0.9); ``working_fraction`` of HBM is reserved for activations, routing buffers and
    KV-transfer staging (an assumption; the article's M_working).
    """

    model: MoEModel
    accelerator: Accelerator
    parallelism: Parallelism = field(default_factory=Parallelism)
    efficiency: Efficiency = field(default_factory=Efficiency)
    memory_utilization: float = 0.9
    working_fraction: float = 0.05

    def __post_init__(self) -> None:
        check_number("worker.memory_utilization", self.memory_utilization, low=0.0, high=1.0,
                     low_inclusive=False)
        check_number("worker.working_fraction", self.working_fraction, low=0.0, high=1.0,
                     high_inclusive=False)
        par, m = self.parallelism, self.model
        if par.pp > m.num_layers:
            raise ConfigError("parallelism.pp", f"{par.pp} stages exceed the model's "
                              f"{m.num_layers} layers; allowed range is [1, {m.num_layers}]")
        if par.ep > m.routed_experts:
            raise ConfigError("parallelism.ep", f"{par.ep} GPUs per stage exceed the "
                              f"{m.routed_experts} routed experts")
        self.check_fits()

    # -- construction -------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "worker") -> "Worker":
        """Keys: ``model``, ``hardware`` (name, TOML path or table), ``parallelism``,
        ``efficiency``, ``memory_utilization``, ``working_fraction``."""
        reject_unknown_keys(where, d, {"model", "hardware", "parallelism", "efficiency",
                                       "memory_utilization", "working_fraction"})
        for req in ("model", "hardware"):
            if req not in d:
                raise ConfigError(f"{where}.{req}", "missing")
        par = dict(d.get("parallelism", {}))
        reject_unknown_keys(f"{where}.parallelism", par, {f.name for f in dataclasses.fields(Parallelism)})
        eff = dict(d.get("efficiency", {}))
        reject_unknown_keys(f"{where}.efficiency", eff, {f.name for f in dataclasses.fields(Efficiency)})
        kw = {k: d[k] for k in ("memory_utilization", "working_fraction") if k in d}
        return cls(model=load_model(d["model"]), accelerator=load_accelerator(d["hardware"]),
                   parallelism=Parallelism(**par), efficiency=Efficiency(**eff), **kw)

    # -- memory -------------------------------------------------------------------------
    @property
    def num_gpus(self) -> int:
        return self.parallelism.num_gpus

    @property
    def _kv_replication(self) -> float:
        """Copies of each KV byte across the TP ranks of an attention replica."""
        a, tp = self.model.attention, self.parallelism.tp
        return float(tp) if a.kind == "mla" else tp / min(tp, a.kv_heads)

    @property
    def non_expert_bytes(self) -> float:
        """Weights every token touches (attention, dense FFN, routers, embeddings, shared experts)."""
        m = self.model
        shared = m.moe_layers * m.shared_experts * m.expert_weight_bytes
        return m.non_expert_params * m.weight_bytes_per_param + shared

    @property
    def weight_bytes_per_gpu(self) -> float:
        p = self.parallelism
        return self.non_expert_bytes / (p.tp * p.pp) + self.model.routed_expert_weight_bytes / (p.ep * p.pp)

    @property
    def usable_bytes_per_gpu(self) -> float:
        return self.accelerator.hbm_bytes * self.memory_utilization

    @property
    def working_bytes_per_gpu(self) -> float:
        return self.accelerator.hbm_bytes * self.working_fraction

    @property
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
                f"usable {self.usable_bytes_per_gpu / 1e9:.1f} GB; raise ep or pp, or use a GPU "
                "with more HBM")

    @property
    def kv_capacity_bytes(self) -> float:
        """Distinct KV bytes the worker can hold (replicas over TP ranks counted once)."""
        return self.kv_bytes_per_gpu * self.num_gpus / self._kv_replication

    @property
    def kv_capacity_tokens(self) -> float:
        return self.kv_capacity_bytes / self.model.kv_bytes_per_token

    def decode_slots(self, context_tokens: float) -> int:
        """Most sequences of ``context_tokens`` whose KV fits in the worker at once."""
        check_number("context_tokens", context_tokens, low=1.0)
        return int(self.kv_capacity_bytes // self.model.kv_bytes(context_tokens))

    # -- phases -------------------------------------------------------------------------
    def _phase(self, name: str, flops: float, hbm_bytes: float, net_bytes: float,
               gpus: float, kv_flops: float = 0.0) -> PhaseTime:
        """Roofline one phase. ``flops`` run at the weight precision's tensor rate; ``kv_flops``
        (attention scores and values over the cache) at the KV precision's rate."""
        a, e, m = self.accelerator, self.efficiency, self.model
        compute_s = (flops / a.peak_flops(m.weight_precision)
                     + kv_flops / a.peak_flops(m.kv_precision)) / (gpus * e.compute)
        flops += kv_flops
        memory_s = hbm_bytes / (gpus * a.hbm_bandwidth * e.memory)
        link = a.scale_up_bandwidth if self.parallelism.ep <= a.scale_up_domain else a.scale_out_bandwidth
        network_s = net_bytes / (gpus * link * e.network) if net_bytes else 0.0
        return PhaseTime(name, flops, hbm_bytes, net_bytes, compute_s, memory_s, network_s)

    def _attention_phase(self, sequences: float, new_tokens: float, cached_tokens: float) -> PhaseTime:
        """Attention over a micro-batch of ``sequences``, each adding ``new_tokens`` after
        ``cached_tokens``; timed on the busiest attention replica (tp GPUs)."""
        m, p = self.model, self.parallelism
        per_replica = math.ceil(sequences / p.dp_attention) if sequences else 0
        q_tokens = per_replica * new_tokens
        # Causal attention: new token i of a sequence attends cached + i tokens.
        attended = cached_tokens + (new_tokens + 1) / 2.0
        absorbed = new_tokens == 1  # MLA: absorbed form in decode, expanded form in fill
        flops = 2.0 * q_tokens * m.num_layers * m.attention_params_per_layer
        kv_flops = per_replica * m.attention_core_flops(new_tokens, attended, absorbed)
        if not absorbed and cached_tokens:
            kv_flops += per_replica * m.full_attention_layers * m.attention.latent_expansion_flops(cached_tokens)
        act = m.activation_bytes_per_element * m.hidden_size
        kv_read = per_replica * (m.kv_bytes(cached_tokens) if cached_tokens else 0.0)
        kv_write = per_replica * new_tokens * m.kv_bytes_per_token
        hbm = (m.num_layers * m.attention_params_per_layer * m.weight_bytes_per_param
               + self._kv_replication * (kv_read + kv_write) + 2 * q_tokens * act * m.num_layers)
        return self._phase("attention", flops, hbm, 0.0, p.tp, kv_flops=kv_flops)

    def _expert_phase(self, tokens: float) -> PhaseTime:
        """Routed + shared experts for ``tokens`` tokens of one micro-batch over a stage's GPUs."""
        m, p = self.model, self.parallelism
        per_layer_distinct = distinct_experts(m.routed_experts, m.active_experts, tokens)
        # Balanced placement, but the busiest GPU holds at least one active expert per layer.
        per_gpu_experts = max(per_layer_distinct / p.ep, min(per_layer_distinct, 1.0))
        act = m.activation_bytes_per_element * m.hidden_size
        routed = tokens * m.active_experts
        flops = 2.0 * m.moe_layers * m.expert_params * tokens * (m.active_experts + m.shared_experts)
        hbm_per_gpu = m.moe_layers * (per_gpu_experts * m.expert_weight_bytes
                                      + (m.shared_experts * m.expert_weight_bytes) / p.tp)
        hbm_per_gpu += m.moe_layers * 2 * routed * act / p.ep
        # Dispatch and combine all-to-all: each routed token leaves and returns unless local.
        net = 2.0 * m.moe_layers * routed * act * (p.ep - 1) / p.ep if p.ep > 1 else 0.0
        ph = self._phase("experts", flops, hbm_per_gpu * p.ep, net, p.ep)
        return ph

    def _dense_phase(self, tokens: float, sequences: float) -> PhaseTime:
        """Dense FFN layers, routers and embeddings/LM head (LM head only for new outputs)."""
        m, p = self.model, self.parallelism
        replicas = min(p.dp_attention, max(sequences, 1))
        dense = m.num_dense_layers * m.dense_ffn_params + m.moe_layers * m.router_params
        head = m.vocab_size * m.hidden_size
        flops = 2.0 * tokens * dense + 2.0 * sequences * head
        hbm = replicas * (dense + m.embedding_params) * m.weight_bytes_per_param
        return self._phase("dense", flops, hbm, 0.0, p.ep)

    def _pass(self, mode: str, sequences: float, new_tokens: float, cached_tokens: float,
              output_sequences: float) -> PassTime:
        tokens = sequences * new_tokens
        phases = (self._attention_phase(sequences, new_tokens, cached_tokens),
                  self._expert_phase(tokens),
                  self._dense_phase(tokens, output_sequences))
        return PassTime(mode, phases, tokens, sequences, self.efficiency.pass_overhead_s,
                        self.parallelism.pp, self.num_gpus)

    # -- the four operating modes --------------------------------------------------------
    def prefill(self, new_tokens: int, sequences: int = 1) -> PassTime:
        """Prefill of ``sequences`` prompts of ``new_tokens`` each, no cached prefix (per micro-batch)."""
        return self.midfill(new_tokens, 0, sequences)

    def midfill(self, new_tokens: int, cached_tokens: int, sequences: int = 1) -> PassTime:
        """``new_tokens`` appended to ``cached_tokens`` of cached KV (read once), per sequence."""
        check_number("new_tokens", new_tokens, low=1.0)
        check_number("cached_tokens", cached_tokens, low=0.0)
        check_number("sequences", sequences, low=1.0)
        mode = "midfill" if cached_tokens > 0 else "prefill"
        return self._pass(mode, sequences, new_tokens, cached_tokens, sequences)

    def decode(self, batch: int, context_tokens: int, check_memory: bool = True) -> PassTime:
        """One decode pass: ``batch`` sequences on the worker, each at ``context_tokens``.

        The batch is split into ``pp`` micro-batches; the pass time is the TPOT. With
        ``check_memory`` off, a batch whose KV would not fit is timed anyway (for tables).
        """
        check_number("batch", batch, low=1.0)
        check_number("context_tokens", context_tokens, low=0.0)
        slots = self.decode_slots(max(context_tokens, 1)) if check_memory else batch
        if batch > slots:
            raise ConfigError("batch", f"{batch} sequences at {context_tokens} tokens need more KV "
                              f"than the worker holds; allowed range is [1, {slots}]")
        micro = batch / self.parallelism.pp
        return self._pass("decode", micro, 1, context_tokens, micro)

    def decode_attention(self, batch: int, context_tokens: int) -> PhaseTime:
        """The attention phase of a decode pass (KV reads private to each sequence)."""
        return self.decode(batch, context_tokens).phase("attention")

    def decode_experts(self, batch: int) -> PhaseTime:
        """The expert phase of a decode pass: distinct experts touched by ``batch`` tokens."""
        check_number("batch", batch, low=1.0)
        return self._expert_phase(batch / self.parallelism.pp)

    # -- plant parameters ---------------------------------------------------------------
    def service_rates(self, prompt_tokens: int, context_tokens: int, cached_tokens: int = 0,
                      decode_batch: int | None = None) -> ServiceRates:
        """Service rates at a nominal request shape: what plant models are parameterised by.

        A fill pass takes one prompt per attention replica (so every GPU works);
        ``decode_batch`` defaults to the largest batch whose KV fits at ``context_tokens``.
        """
        fill = self.midfill(prompt_tokens, cached_tokens, sequences=self.parallelism.dp_attention)
        slots = self.decode_slots(context_tokens)
        if slots < 1:
            raise ConfigError("context_tokens", f"one sequence of {context_tokens} tokens does not "
                              "fit in the worker's KV memory")
        batch = slots if decode_batch is None else int(check_int("decode_batch", decode_batch,
                                                                  low=1, high=slots))
        dec = self.decode(batch, context_tokens)
        return ServiceRates(
            fill_seconds=fill.time_s,
            fill_tokens_per_s=fill.tokens_per_s,
            decode_step_s=dec.time_s,
            decode_batch=batch,
            decode_slots=slots,
            decode_tokens_per_s=dec.tokens_per_s,
            kv_bytes_per_request=self.model.kv_bytes(prompt_tokens + cached_tokens),
            num_gpus=self.num_gpus,
        )


def decode_sweep(worker: Worker, batches, contexts) -> pd.DataFrame:
    """Decode pass time and throughput over batch sizes and contexts; one row per feasible point."""
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
                         "decode_slots": slots})
    return pd.DataFrame(rows)
