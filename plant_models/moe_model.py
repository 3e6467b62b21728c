"""MoE model descriptors: parameter counts, weight bytes and KV bytes per token.

The counts follow the published Hugging Face ``config.json`` of each model and the usual
DeepSeek-V3 module layout (MLA attention with low-rank Q and latent KV, SwiGLU FFNs with three
matrices, one router per MoE layer, untied embedding and LM head). A layer group may mix full
attention with linear or local (sliding-window) attention layers: only full-attention layers
grow KV per token, which is why hybrids reach ~25 kB/token (reference article section 14).
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenfactory.plant_models.hardware import PRECISIONS
from tokenfactory.core.validation import (
    ConfigError,
    check_choice,
    check_fields,
    check_int,
    check_number,
    REQUIRED,
    reject_unknown_keys,
    setting,
    setting_names,
)

__all__ = [
    "AttentionSpec",
    "MoEModel",
    "MODEL_SCHEMA",
    "ATTENTION_SCHEMA",
    "MODEL_PRESETS",
    "model_preset",
    "model_from_dict",
    "load_model",
]


@dataclass(frozen=True)
class AttentionSpec:
    """Attention of one model: its kind, its sizes, and which layers are full attention.

    kind ``"gqa"`` (multi-head / grouped-query): ``num_heads``, ``head_dim``, ``kv_heads``.
    kind ``"mla"`` (multi-head latent attention, DeepSeek-V2/V3): ``num_heads``, ``q_lora_rank``
    (0 for a plain Q projection), ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``,
    ``v_head_dim``; the KV cache holds the latent (kv_lora_rank) plus the shared RoPE key.

    ``full_attention_layers`` (default: all layers) are full attention; the others are
    ``efficient_kind`` layers: ``"linear"`` (a fixed recurrent state of
    ``linear_state_bytes_per_layer`` per sequence) or ``"local"`` (sliding window of
    ``local_window`` tokens). Their projection parameters are counted like a full layer's.

    Sizes are element counts (dimensions), not bytes, unless named ``_bytes``; bytes come from
    the model's precisions. The spec is checked by :meth:`validate` when a :class:`MoEModel` is
    built, not on its own.

    Parameters
    ----------
    kind : {"gqa", "mla"}
        Grouped-query (including plain multi-head) or multi-head latent attention.
    num_heads : int
        Query heads (>= 1).
    head_dim : int
        Dimension per head for GQA (>= 1; default 128); unused by MLA.
    kv_heads : int
        Key/value heads for GQA, in [1, ``num_heads``] (default 0: must be given for GQA).
    q_lora_rank : int
        MLA low-rank Q dimension (>= 0; default 0: a plain Q projection).
    kv_lora_rank : int
        MLA latent KV dimension (>= 1 for MLA), cached per token and layer.
    qk_nope_head_dim : int
        MLA per-head query/key dimension without rotary position (>= 1 for MLA).
    qk_rope_head_dim : int
        MLA rotary key dimension, shared across heads and cached per token (>= 1 for MLA).
    v_head_dim : int
        MLA per-head value dimension (>= 1 for MLA).
    full_attention_layers : int, optional
        Layers with full attention, in [0, num_layers]; ``None`` (default) is every layer.
    efficient_kind : {"linear", "local"}
        What the other layers are (default ``"linear"``).
    local_window : int
        Sliding-window length of local layers (tokens, >= 1; default 4096).
    linear_state_bytes_per_layer : float
        Recurrent state of one sequence in one linear-attention layer (bytes, >= 0; default 0).
    """

    kind: str = setting(REQUIRED, kind=str, choices=("gqa", "mla"),
                        meaning="grouped-query (plain multi-head included) or multi-head latent attention")
    num_heads: int = setting(REQUIRED, kind=int, low=1, meaning="query heads")
    head_dim: int = setting(128, kind=int, low=1, meaning="dimension per head (GQA; unused by MLA)")
    kv_heads: int = setting(0, kind=int, low=0, meaning="key/value heads (GQA: must be given, in [1, num_heads]; "
                                                        "unused by MLA)")
    q_lora_rank: int = setting(0, kind=int, low=0, meaning="MLA low-rank Q dimension (0: a plain Q projection)")
    kv_lora_rank: int = setting(0, kind=int, low=0, meaning="MLA latent KV dimension, cached per token and layer "
                                                            "(>= 1 for MLA)")
    qk_nope_head_dim: int = setting(0, kind=int, low=0, meaning="MLA per-head query/key dimension without rotary "
                                                                "position (>= 1 for MLA)")
    qk_rope_head_dim: int = setting(0, kind=int, low=0, meaning="MLA rotary key dimension, shared across heads and "
                                                                "cached per token (>= 1 for MLA)")
    v_head_dim: int = setting(0, kind=int, low=0, meaning="MLA per-head value dimension (>= 1 for MLA)")
    full_attention_layers: int | None = setting(None, kind=int, low=0, unit="layers",
                                                meaning="layers with full attention, at most num_layers "
                                                        "(absent: every layer)")
    efficient_kind: str = setting("linear", kind=str, choices=("linear", "local"),
                                  meaning="what the other layers are: linear attention (a fixed state per "
                                          "sequence) or a local sliding window")
    local_window: int = setting(4096, kind=int, low=1, unit="tokens", meaning="sliding-window length of local layers")
    linear_state_bytes_per_layer: float = setting(0.0, low=0.0, unit="bytes",
                                                  meaning="recurrent state of one sequence in one linear-attention "
                                                          "layer")

    def validate(self, where: str, num_layers: int) -> None:
        """Check the fields for a model of ``num_layers`` layers; raises :class:`ConfigError`
        naming ``where.<field>`` and its allowed range."""
        check_choice(f"{where}.kind", self.kind, ("gqa", "mla"))
        check_int(f"{where}.num_heads", self.num_heads, low=1)
        if self.kind == "gqa":
            check_int(f"{where}.head_dim", self.head_dim, low=1)
            check_int(f"{where}.kv_heads", self.kv_heads, low=1, high=self.num_heads)
        else:
            check_int(f"{where}.q_lora_rank", self.q_lora_rank, low=0)
            for f in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                check_int(f"{where}.{f}", getattr(self, f), low=1)
        if self.full_attention_layers is not None:
            check_int(f"{where}.full_attention_layers", self.full_attention_layers, low=0,
                      high=num_layers)
        check_choice(f"{where}.efficient_kind", self.efficient_kind, ("linear", "local"))
        check_int(f"{where}.local_window", self.local_window, low=1)
        check_number(f"{where}.linear_state_bytes_per_layer", self.linear_state_bytes_per_layer,
                     low=0.0)

    # -- per-layer quantities ------------------------------------------------------------
    def params_per_layer(self, hidden: int) -> int:
        """Projection parameters of one attention layer (plus its low-rank norms for MLA)."""
        if self.kind == "gqa":
            q = hidden * self.num_heads * self.head_dim
            kv = 2 * hidden * self.kv_heads * self.head_dim
            o = self.num_heads * self.head_dim * hidden
            return q + kv + o
        qk_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
        if self.q_lora_rank:
            q = hidden * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * self.num_heads * qk_dim
        else:
            q = hidden * self.num_heads * qk_dim
        kv_a = hidden * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
        kv_b = self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
        o = self.num_heads * self.v_head_dim * hidden
        return q + kv_a + kv_b + o

    def kv_elements_per_token_per_layer(self) -> int:
        """Cached elements per token in one full-attention layer."""
        if self.kind == "gqa":
            return 2 * self.kv_heads * self.head_dim
        return self.kv_lora_rank + self.qk_rope_head_dim

    def core_flops_per_query_token(self, attended: float, absorbed: bool = True) -> float:
        """Score + value FLOPs of one query token attending ``attended`` cached tokens, one layer.

        MLA has two forms (DeepSeek-V2 paper, section 2.1.2 and its note on weight absorption):
        *absorbed* (decode) scores over kv_lora_rank + rope dims and values over kv_lora_rank per
        head; *expanded* (prefill) scores over qk_nope + rope dims and values over v_head_dim.
        """
        if self.kind == "gqa":
            return 4.0 * attended * self.num_heads * self.head_dim
        if absorbed:
            return 2.0 * attended * self.num_heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim)
        return 2.0 * attended * self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim
                                                  + self.v_head_dim)

    def latent_expansion_flops(self, cached: float) -> float:
        """FLOPs to up-project ``cached`` latent KV entries to per-head K/V in one layer
        (MLA expanded form only; zero for GQA, whose cache is already per head)."""
        if self.kind == "gqa":
            return 0.0
        return 2.0 * cached * self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)


@dataclass(frozen=True)
class MoEModel:
    """A mixture-of-experts transformer, as far as service rates need it.

    ``num_dense_layers`` are the leading layers with a dense FFN (DeepSeek's
    ``first_k_dense_replace``); the rest have ``routed_experts`` experts of which
    ``active_experts`` (k) are chosen per token, plus ``shared_experts`` always-on experts.
    Precisions are names in :data:`tokenfactory.plant_models.hardware.PRECISIONS`;
    ``expert_precision`` (default: ``weight_precision``) is that of the routed and shared experts,
    because the published FP4 checkpoints quantize only the MoE experts (e.g. nvidia/DeepSeek-R1-FP4
    model card: "only the weights and activations of the linear operators within transformer
    blocks in MoE are quantized"), the rest stays FP8/BF16.

    Sizes are element counts from the model's Hugging Face ``config.json``; the presets in
    :data:`MODEL_PRESETS` name their source.

    Parameters
    ----------
    name : str
        Preset or user name.
    num_layers : int
        Transformer layers (>= 1).
    num_dense_layers : int
        Leading layers with a dense FFN instead of experts, in [0, ``num_layers``].
    hidden_size : int
        Model (residual stream) dimension (>= 1).
    vocab_size : int
        Vocabulary size (tokens, >= 1).
    dense_intermediate_size : int
        Intermediate dimension of the dense FFN layers (>= 0).
    expert_intermediate_size : int
        Intermediate dimension of one expert (>= 1).
    routed_experts : int
        Routed experts E per MoE layer (>= 1).
    active_experts : int
        Routed experts k chosen per token, in [1, E].
    shared_experts : int
        Always-on experts per MoE layer (>= 0).
    attention : AttentionSpec
        The attention layers.
    weight_precision : str
        Number format of the non-expert weights, a key of ``PRECISIONS`` (default ``"fp8"``).
    kv_precision : str
        Number format of the KV cache (default ``"bf16"``).
    activation_precision : str
        Number format of activations (default ``"bf16"``).
    tied_embeddings : bool
        Whether the LM head shares the embedding matrix (default False).
    expert_precision : str, optional
        Number format of routed and shared experts; ``None`` (default) is ``weight_precision``.
    expert_activation_precision : str, optional
        Number format the experts' GEMM inputs are quantised to; ``None`` (default) is
        ``expert_precision`` (W8A8, W4A4). The expert GEMMs multiply at the tensor rate of the
        wider of it and ``expert_precision`` (MXFP4 weights with BF16 activations, W4A16, run at
        the BF16 rate), and FP4 weights with wider activations on a GPU without FP4 tensor cores
        are dequantised and multiply at BF16 (TensorRT-LLM's gpt-oss MoE support matrix: Hopper
        BF16 x MXFP4 on HGMMA, FP8 x MXFP4 not enabled).
    source : str
        Where the figures come from.

    Raises
    ------
    ConfigError
        For a value outside its range, k > E, an unknown precision or an invalid attention spec
        (fields ``model[<name>].*``).
    """

    name: str = setting(REQUIRED, kind=str, meaning="the model's name (in reports)")
    num_layers: int = setting(REQUIRED, kind=int, low=1, unit="layers", meaning="transformer layers")
    num_dense_layers: int = setting(REQUIRED, kind=int, low=0, unit="layers",
                                    meaning="leading layers with a dense FFN instead of experts (DeepSeek's "
                                            "first_k_dense_replace), at most num_layers")
    hidden_size: int = setting(REQUIRED, kind=int, low=1, meaning="model (residual stream) dimension")
    vocab_size: int = setting(REQUIRED, kind=int, low=1, unit="tokens", meaning="vocabulary size")
    dense_intermediate_size: int = setting(REQUIRED, kind=int, low=0,
                                           meaning="intermediate dimension of the dense FFN layers")
    expert_intermediate_size: int = setting(REQUIRED, kind=int, low=1, meaning="intermediate dimension of one expert")
    routed_experts: int = setting(REQUIRED, kind=int, low=1, meaning="routed experts E per MoE layer")
    active_experts: int = setting(REQUIRED, kind=int, low=1, meaning="routed experts k chosen per token, at most "
                                                                     "routed_experts")
    shared_experts: int = setting(REQUIRED, kind=int, low=0, meaning="always-on experts per MoE layer")
    attention: AttentionSpec = setting(REQUIRED, kind="table", meaning="the attention layers (the model.attention "
                                                                       "table)")
    weight_precision: str = setting("fp8", kind=str, choices=tuple(PRECISIONS),
                                    meaning="number format of the non-expert weights")
    kv_precision: str = setting("bf16", kind=str, choices=tuple(PRECISIONS), meaning="number format of the KV cache")
    activation_precision: str = setting("bf16", kind=str, choices=tuple(PRECISIONS),
                                        meaning="number format of activations")
    tied_embeddings: bool = setting(False, kind=bool, meaning="whether the LM head shares the embedding matrix")
    expert_precision: str | None = setting(None, kind=str, choices=tuple(PRECISIONS),
                                           meaning="number format of routed and shared experts (absent: "
                                                   "weight_precision; FP4 checkpoints quantize only the experts)",
                                           source="nvidia/DeepSeek-R1-FP4 model card")
    expert_activation_precision: str | None = setting(
        None, kind=str, choices=tuple(PRECISIONS),
        meaning="number format the routed and shared experts' GEMM inputs are quantised to (absent: "
                "expert_precision, as W8A8 / W4A4 recipes do); the expert GEMMs multiply at the wider of it and "
                "expert_precision, and FP4 weights with wider activations on a GPU without FP4 tensor cores are "
                "dequantised and multiply at BF16",
        source="TensorRT-LLM examples/models/core/gpt_oss/README.md (MoE support matrix: MXFP4 weights with BF16 "
               "activations on Hopper, HGMMA; MXFP8 activations on Blackwell; FP8 x MXFP4 not enabled on Hopper)")
    source: str = setting("", kind=str, meaning="where the figures come from (a config.json URL)")

    def __post_init__(self) -> None:
        w = f"model[{self.name}]"
        check_fields(self, w, names=("num_layers",), hold=False)  # first: it bounds num_dense_layers
        check_fields(self, w, names=("num_dense_layers", "hidden_size", "vocab_size", "expert_intermediate_size",
                                     "routed_experts", "active_experts", "dense_intermediate_size", "shared_experts"),
                     bounds={"num_dense_layers": {"high": self.num_layers}}, hold=False)
        if self.active_experts > self.routed_experts:
            raise ConfigError(f"{w}.active_experts",
                              f"k = {self.active_experts} exceeds routed_experts E = "
                              f"{self.routed_experts}; allowed range is [1, {self.routed_experts}]")
        check_fields(self, w, names=("weight_precision", "kv_precision", "activation_precision"), hold=False)
        if self.expert_precision is None:
            object.__setattr__(self, "expert_precision", self.weight_precision)
        check_fields(self, w, names=("expert_precision",), hold=False)
        if self.expert_activation_precision is not None:
            check_fields(self, w, names=("expert_activation_precision",), hold=False)
        self.attention.validate(f"{w}.attention", self.num_layers)

    # -- structure -------------------------------------------------------------------------
    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers

    @property
    def full_attention_layers(self) -> int:
        fa = self.attention.full_attention_layers
        return self.num_layers if fa is None else fa

    @property
    def efficient_attention_layers(self) -> int:
        return self.num_layers - self.full_attention_layers

    # -- parameter counts ------------------------------------------------------------------
    @property
    def expert_params(self) -> int:
        """One SwiGLU expert: gate, up and down projections."""
        return 3 * self.hidden_size * self.expert_intermediate_size

    @property
    def dense_ffn_params(self) -> int:
        return 3 * self.hidden_size * self.dense_intermediate_size

    @property
    def attention_params_per_layer(self) -> int:
        return self.attention.params_per_layer(self.hidden_size)

    @property
    def router_params(self) -> int:
        return self.routed_experts * self.hidden_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)

    @property
    def _norm_params(self) -> int:
        return (2 * self.num_layers + 1) * self.hidden_size

    @property
    def non_expert_params(self) -> int:
        """Parameters every token touches: attention, dense FFNs, routers, norms, embeddings."""
        return (self.num_layers * self.attention_params_per_layer
                + self.num_dense_layers * self.dense_ffn_params
                + self.moe_layers * self.router_params
                + self.embedding_params + self._norm_params)

    @property
    def total_params(self) -> int:
        per_moe_layer = (self.routed_experts + self.shared_experts) * self.expert_params
        return self.non_expert_params + self.moe_layers * per_moe_layer

    @property
    def active_params(self) -> int:
        per_moe_layer = (self.active_experts + self.shared_experts) * self.expert_params
        return self.non_expert_params + self.moe_layers * per_moe_layer

    # -- bytes ----------------------------------------------------------------------------
    @property
    def weight_bytes_per_param(self) -> float:
        return PRECISIONS[self.weight_precision]

    @property
    def activation_bytes_per_element(self) -> float:
        return PRECISIONS[self.activation_precision]

    @property
    def expert_bytes_per_param(self) -> float:
        return PRECISIONS[self.expert_precision]

    @property
    def weight_bytes(self) -> float:
        experts = self.moe_layers * (self.routed_experts + self.shared_experts) * self.expert_params
        return (self.non_expert_params * self.weight_bytes_per_param
                + experts * self.expert_bytes_per_param)

    @property
    def expert_weight_bytes(self) -> float:
        """Bytes of one routed expert (the B_W of section 15)."""
        return self.expert_params * self.expert_bytes_per_param

    @property
    def routed_expert_weight_bytes(self) -> float:
        return self.moe_layers * self.routed_experts * self.expert_weight_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        """KV bytes each cached token adds, summed over full-attention layers."""
        return (self.full_attention_layers * self.attention.kv_elements_per_token_per_layer()
                * PRECISIONS[self.kv_precision])

    def kv_bytes(self, context_tokens: float) -> float:
        """KV state of one sequence of ``context_tokens`` (full + local windows + linear states)."""
        per_layer_tok = self.attention.kv_elements_per_token_per_layer() * PRECISIONS[self.kv_precision]
        eff = self.efficient_attention_layers
        if self.attention.efficient_kind == "local":
            fixed = eff * min(context_tokens, self.attention.local_window) * per_layer_tok
        else:
            fixed = eff * self.attention.linear_state_bytes_per_layer
        return self.kv_bytes_per_token * context_tokens + fixed

    def attention_core_flops(self, query_tokens: float, attended_tokens: float,
                             absorbed: bool = True) -> float:
        """Score/value FLOPs over all layers for ``query_tokens`` each attending ``attended_tokens``."""
        a = self.attention
        full = self.full_attention_layers * a.core_flops_per_query_token(attended_tokens, absorbed)
        if a.efficient_kind == "local":
            eff = self.efficient_attention_layers * a.core_flops_per_query_token(
                min(attended_tokens, a.local_window), absorbed)
        else:  # linear attention: a state update and read of size heads x d x d per token
            eff = self.efficient_attention_layers * 4.0 * a.num_heads * a.head_dim ** 2
        return query_tokens * (full + eff)

    def causal_attention_core_flops(self, new_tokens: float, cached_tokens: float = 0.0,
                                    absorbed: bool | None = None) -> float:
        """Score/value FLOPs over all layers of one sequence adding ``new_tokens`` after
        ``cached_tokens`` under the causal mask: new token i (1..n) attends c + i tokens in a
        full-attention layer, min(c + i, W) in a local layer of window W, so a full layer averages
        c + (n + 1) / 2 attended tokens and a local one the exact mean of min(c + i, W)
        (``(1/n) sum_i min(c + i, W)``; W - W (W - 1) / (2 n) for c = 0 and n >= W); a
        linear-attention layer costs its state update per token.

        Parameters
        ----------
        new_tokens : float
            Query tokens n of the sequence (>= 1).
        cached_tokens : float
            Tokens c already in its cache (>= 0; default 0: a prefill).
        absorbed : bool, optional
            MLA's absorbed (decode) form; ``None`` (default) is absorbed for one new token only.

        Returns
        -------
        float
            FLOPs over the model's layers (n x the per-query-token FLOPs at the mean attended).
        """
        check_number("new_tokens", new_tokens, low=0.0)
        check_number("cached_tokens", cached_tokens, low=0.0)
        a, n, c = self.attention, float(new_tokens), float(cached_tokens)
        if absorbed is None:
            absorbed = n == 1
        if n == 0:
            return 0.0
        full = self.full_attention_layers * a.core_flops_per_query_token(c + (n + 1) / 2.0, absorbed)
        if a.efficient_kind == "local":
            w = float(a.local_window)
            eff = self.efficient_attention_layers * a.core_flops_per_query_token(
                _mean_local_attended(n, c, w), absorbed)
        else:  # linear attention: a state update and read of size heads x d x d per token
            eff = self.efficient_attention_layers * 4.0 * a.num_heads * a.head_dim ** 2
        return n * (full + eff)

    def summary(self) -> dict[str, Any]:
        """Derived figures (what ``tokenfactory describe model`` prints)."""
        return {
            "name": self.name,
            "total_params": self.total_params,
            "active_params": self.active_params,
            "active_fraction": self.active_params / self.total_params,
            "weight_bytes": self.weight_bytes,
            "weight_precision": self.weight_precision,
            "expert_precision": self.expert_precision,
            "expert_activation_precision": self.expert_activation_precision or self.expert_precision,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_precision": self.kv_precision,
            "kv_bytes_at_128k_context": self.kv_bytes(131072),
            "expert_params": self.expert_params,
            "expert_weight_bytes": self.expert_weight_bytes,
            "routed_expert_weight_fraction": self.routed_expert_weight_bytes / self.weight_bytes,
            "attention_params_per_layer": self.attention_params_per_layer,
            "moe_layers": self.moe_layers,
            "dense_layers": self.num_dense_layers,
            "full_attention_layers": self.full_attention_layers,
            "routed_experts": self.routed_experts,
            "active_experts": self.active_experts,
            "shared_experts": self.shared_experts,
            "source": self.source,
        }


def _mean_local_attended(n: float, c: float, w: float) -> float:
    """(1/n) sum over i = 1..n of min(c + i, w): the mean tokens a query of a chunk of n new tokens
    after c cached ones attends in a local layer of window w (exact for integer n and c; the sum of
    the rising part c + 1 .. w and the flat part at w)."""
    if c >= w:
        return w
    k = min(n, w - c)                      # the queries still inside the window's rise
    rising = k * c + k * (k + 1) / 2.0     # sum of c + i for i = 1..k
    return (rising + (n - k) * w) / n


def _dense(name: str, layers: int, hidden: int, ffn: int, heads: int, kv_heads: int, head_dim: int,
           vocab: int, source: str) -> "MoEModel":
    """A dense transformer as a model whose every layer has a dense FFN (no MoE layers: one nominal
    routed expert that no layer holds, so expert bytes and traffic are zero)."""
    return MoEModel(name=name, num_layers=layers, num_dense_layers=layers, hidden_size=hidden,
                    vocab_size=vocab, dense_intermediate_size=ffn, expert_intermediate_size=1,
                    routed_experts=1, active_experts=1, shared_experts=0,
                    attention=AttentionSpec(kind="gqa", num_heads=heads, head_dim=head_dim, kv_heads=kv_heads),
                    weight_precision="bf16", kv_precision="bf16", source=source + "; dense")


_MLA_DSV3 = dict(kind="mla", q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                 qk_rope_head_dim=64, v_head_dim=128)

MODEL_PRESETS: dict[str, MoEModel] = {
    m.name: m
    for m in (
        MoEModel(
            name="deepseek-v3", num_layers=61, num_dense_layers=3, hidden_size=7168,
            vocab_size=129280, dense_intermediate_size=18432, expert_intermediate_size=2048,
            routed_experts=256, active_experts=8, shared_experts=1,
            attention=AttentionSpec(num_heads=128, **_MLA_DSV3),
            weight_precision="fp8", kv_precision="bf16",
            source="deepseek-ai/DeepSeek-V3 config.json; DeepSeek-V3 Technical Report "
                   "(arXiv:2412.19437): 671B total, 37B activated; MTP module excluded",
        ),
        MoEModel(
            name="kimi-k2", num_layers=61, num_dense_layers=1, hidden_size=7168,
            vocab_size=163840, dense_intermediate_size=18432, expert_intermediate_size=2048,
            routed_experts=384, active_experts=8, shared_experts=1,
            attention=AttentionSpec(num_heads=64, **_MLA_DSV3),
            weight_precision="fp8", kv_precision="bf16",
            source="moonshotai/Kimi-K2-Instruct config.json; Kimi K2 model card: 1.04T total, "
                   "32B activated",
        ),
        # -- the models of the measured serving runs (study roofline-validation, issue 24) ----------
        MoEModel(
            name="qwen3-235b-a22b", num_layers=94, num_dense_layers=0, hidden_size=4096,
            vocab_size=151936, dense_intermediate_size=0, expert_intermediate_size=1536,
            routed_experts=128, active_experts=8, shared_experts=0,
            attention=AttentionSpec(kind="gqa", num_heads=64, head_dim=128, kv_heads=4),
            weight_precision="bf16", kv_precision="bf16",
            source="Qwen/Qwen3-235B-A22B config.json (94 layers, hidden 4096, 64 heads / 4 KV heads x "
                   "128, 128 experts of 1536, 8 active, vocab 151,936, untied); model card: 235B total, "
                   "22B activated",
        ),
        MoEModel(
            name="qwen3.5-397b-a17b", num_layers=60, num_dense_layers=0, hidden_size=4096,
            vocab_size=248320, dense_intermediate_size=0, expert_intermediate_size=1024,
            routed_experts=512, active_experts=10, shared_experts=1,
            attention=AttentionSpec(kind="gqa", num_heads=32, head_dim=256, kv_heads=2,
                                    full_attention_layers=15, efficient_kind="linear",
                                    linear_state_bytes_per_layer=64 * 128 * 128 * 2),
            weight_precision="bf16", kv_precision="bf16",
            source="Qwen/Qwen3.5-397B-A17B model card and config.json: 60 layers in 15 groups of 3 Gated "
                   "DeltaNet + 1 gated full-attention layer (32 Q heads, 2 KV heads x 256), DeltaNet with "
                   "64 value heads x 128 (state 64 x 128 x 128 per layer, BF16 here), 512 experts of 1024, "
                   "10 routed + 1 shared, hidden 4096, vocab 248,320; 397B total, 17B activated. The "
                   "DeltaNet projections are counted as a full-attention layer's (an approximation)",
        ),
        MoEModel(
            name="gpt-oss-120b", num_layers=36, num_dense_layers=0, hidden_size=2880,
            vocab_size=201088, dense_intermediate_size=0, expert_intermediate_size=2880,
            routed_experts=128, active_experts=4, shared_experts=0,
            attention=AttentionSpec(kind="gqa", num_heads=64, head_dim=64, kv_heads=8,
                                    full_attention_layers=18, efficient_kind="local", local_window=128),
            weight_precision="bf16", expert_precision="fp4", expert_activation_precision="fp8",
            kv_precision="bf16",
            source="openai/gpt-oss-120b config.json (36 layers alternating full and 128-token sliding "
                   "attention, 64 Q heads / 8 KV heads x 64, 128 experts of 2880, 4 active, hidden 2880, "
                   "vocab 201,088; quantization_config mxfp4 with modules_to_not_convert self_attn, router, "
                   "embed_tokens, lm_head); model card: MXFP4 experts, the rest BF16; 117B total, 5.1B active. "
                   "Expert activations MXFP8 on Blackwell, BF16 on Hopper (TensorRT-LLM "
                   "examples/models/core/gpt_oss/README.md, MoE support matrix)",
        ),
        MoEModel(
            name="minimax-m2.5", num_layers=62, num_dense_layers=0, hidden_size=3072,
            vocab_size=200064, dense_intermediate_size=0, expert_intermediate_size=1536,
            routed_experts=256, active_experts=8, shared_experts=0,
            attention=AttentionSpec(kind="gqa", num_heads=48, head_dim=128, kv_heads=8),
            weight_precision="fp8", kv_precision="bf16",
            source="MiniMaxAI/MiniMax-M2.5 config.json (MiniMax-M2 architecture: 62 layers, hidden 3072, "
                   "48 Q heads / 8 KV heads x 128, 256 experts of 1536, 8 active, no shared expert, vocab "
                   "200,064); FP8 checkpoint; 230B total, 10B active",
        ),
        MoEModel(
            name="glm-5", num_layers=78, num_dense_layers=3, hidden_size=6144,
            vocab_size=154880, dense_intermediate_size=12288, expert_intermediate_size=2048,
            routed_experts=256, active_experts=8, shared_experts=1,
            attention=AttentionSpec(kind="mla", num_heads=64, q_lora_rank=2048, kv_lora_rank=512,
                                    qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256),
            weight_precision="bf16", kv_precision="bf16",
            source="zai-org/GLM-5 config.json (GlmMoeDsaForCausalLM: 78 layers, first 3 dense, 256 experts "
                   "of 2048, 8 active + 1 shared, hidden 6144, MLA with kv_lora_rank 512, rope 64, 64 "
                   "heads); GLM-5 README: 744B total, 40B active. The DSA sparse-attention indexer is not "
                   "modelled (full MLA attention)",
        ),
        _dense("llama-3.1-70b", 80, 8192, 28672, 64, 8, 128, 128256,
               "meta-llama/Llama-3.1-70B config.json (80 layers, hidden 8192, FFN 28,672, 64 Q heads / "
               "8 KV heads x 128, vocab 128,256, untied)"),
        _dense("llama-3.1-8b", 32, 4096, 14336, 32, 8, 128, 128256,
               "meta-llama/Llama-3.1-8B-Instruct config.json (32 layers, hidden 4096, FFN 14,336, 32 Q "
               "heads / 8 KV heads x 128, vocab 128,256, untied)"),
        _dense("qwen3-32b", 64, 5120, 25600, 64, 8, 128, 151936,
               "Qwen/Qwen3-32B config.json (64 layers, hidden 5120, FFN 25,600, 64 Q heads / 8 KV heads "
               "x 128, vocab 151,936, untied)"),
        MoEModel(
            name="hybrid-25k", num_layers=48, num_dense_layers=1, hidden_size=7168,
            vocab_size=163840, dense_intermediate_size=18432, expert_intermediate_size=2048,
            routed_experts=384, active_experts=8, shared_experts=1,
            attention=AttentionSpec(kind="gqa", num_heads=64, head_dim=128, kv_heads=4,
                                    full_attention_layers=12, efficient_kind="linear",
                                    linear_state_bytes_per_layer=64 * 128 * 128 * 2),
            weight_precision="fp8", kv_precision="bf16",
            source="ASSUMPTION, not a published model: a Kimi-K2-sized MoE body with hybrid "
                   "layer groups of 1 full GQA layer (4 KV heads x 128) per 3 linear-attention "
                   "layers, chosen to give ~25 kB/token as the reference article (section 14) "
                   "suggests for recent hybrids",
        ),
        MoEModel(
            name="k3-like", num_layers=61, num_dense_layers=1, hidden_size=7168,
            vocab_size=163840, dense_intermediate_size=18432, expert_intermediate_size=2048,
            routed_experts=384, active_experts=8, shared_experts=1,
            attention=AttentionSpec(num_heads=64, full_attention_layers=16, efficient_kind="local",
                                    local_window=4096, **_MLA_DSV3),
            weight_precision="fp8", expert_precision="fp4", kv_precision="bf16",
            source="ASSUMPTION, not a published model: the reference article (section 23) projects "
                   "an unreleased 'Kimi K3' with localized-attention layers and gives no sizes. "
                   "Built as the Kimi K2 body (moonshotai/Kimi-K2-Instruct config.json: 61 layers, "
                   "384 experts, 8 active, MLA with 64 heads) with 16 full MLA layers and 45 "
                   "sliding-window (4,096-token) MLA layers, FP4 experts (Blackwell-native; Kimi "
                   "K2 Thinking already ships 4-bit experts) and FP8 for the rest",
        ),
    )
}


def model_preset(name: str) -> MoEModel:
    """The preset called ``name`` (case-insensitive).

    Parameters
    ----------
    name : str
        One of :data:`MODEL_PRESETS`: ``deepseek-v3``, ``kimi-k2``, ``hybrid-25k``, ``k3-like`` and
        the models of the measured serving runs (``qwen3-235b-a22b``, ``qwen3.5-397b-a17b``,
        ``gpt-oss-120b``, ``minimax-m2.5``, ``glm-5``, dense ``llama-3.1-70b``, ``llama-3.1-8b``,
        ``qwen3-32b``).

    Returns
    -------
    MoEModel
        The preset.

    Raises
    ------
    ConfigError
        For an unknown name (field ``model``; the message lists the presets).
    """
    key = name.lower()
    if key not in MODEL_PRESETS:
        raise ConfigError("model", f"unknown preset {name!r}; presets are {', '.join(MODEL_PRESETS)}")
    return MODEL_PRESETS[key]


#: the keys of a model table (``[model]`` or a model TOML): the MoEModel fields and ``base``
MODEL_SCHEMA = {"base": setting(None, kind=str, choices=tuple(MODEL_PRESETS),
                                meaning="a preset to start from: the other keys override its fields (and attention's); "
                                        "without it every size and the attention table are required"),
                **{f.name: f for f in dataclasses.fields(MoEModel)}}
#: the keys of a model's ``attention`` table
ATTENTION_SCHEMA = {f.name: f for f in dataclasses.fields(AttentionSpec)}
_MODEL_FIELDS = set(setting_names(MoEModel))
_ATTN_FIELDS = set(ATTENTION_SCHEMA)


def model_from_dict(d: Mapping[str, Any], where: str = "model") -> MoEModel:
    """Build a model from a mapping; ``base = "deepseek-v3"`` overrides a preset's fields.

    ``attention`` is a nested mapping with :class:`AttentionSpec` fields.

    Parameters
    ----------
    d : mapping
        Keys among the :class:`MoEModel` fields plus an optional ``base`` preset name. With
        ``base``, the given keys (and ``attention`` keys) override the preset's; where the
        preset's ``expert_precision`` equals its ``weight_precision``, the experts follow an
        overridden ``weight_precision``. Without ``base``, ``attention`` (with ``kind`` and ``num_heads``)
        and every size field are required; precisions, ``tied_embeddings`` and ``source`` have
        defaults.
    where : str
        Dotted path of the table, used in error messages (default ``"model"``).

    Returns
    -------
    MoEModel
        The validated model.

    Raises
    ------
    ConfigError
        For an unknown key (also in ``attention``), an unknown ``base``, a missing field or a value
        outside its range.
    """
    d = dict(d)
    reject_unknown_keys(where, d, MODEL_SCHEMA)
    base = d.pop("base", None)
    attn = d.pop("attention", None)
    if attn is not None and not isinstance(attn, Mapping):
        raise ConfigError(f"{where}.attention", "expected a table of attention fields")
    if attn is not None:
        reject_unknown_keys(f"{where}.attention", attn, ATTENTION_SCHEMA)
    if base is not None:
        preset = model_preset(base)
        merged = {f: getattr(preset, f) for f in _MODEL_FIELDS}
        if preset.expert_precision == preset.weight_precision:
            merged["expert_precision"] = None  # experts follow an overridden weight_precision
        merged.update(d)
        attn_merged = dataclasses.asdict(preset.attention)
        attn_merged.update(attn or {})
        merged["attention"] = AttentionSpec(**attn_merged)
        return MoEModel(**merged)
    if attn is None:
        raise ConfigError(f"{where}.attention", "missing (give it, or start from base = PRESET)")
    if "kind" not in attn or "num_heads" not in attn:
        raise ConfigError(f"{where}.attention.kind" if "kind" not in attn
                          else f"{where}.attention.num_heads", "missing")
    missing = sorted(_MODEL_FIELDS - {"attention", "source", "weight_precision", "kv_precision",
                                      "activation_precision", "tied_embeddings",
                                      "expert_precision", "expert_activation_precision"} - set(d))
    if missing:
        raise ConfigError(f"{where}.{missing[0]}", "missing (give it, or start from base = PRESET)")
    return MoEModel(attention=AttentionSpec(**attn), **d)


def load_model(spec: str | Path | Mapping[str, Any] | MoEModel) -> MoEModel:
    """A preset name, a TOML file path, a mapping, or a :class:`MoEModel` as-is.

    Parameters
    ----------
    spec : str, pathlib.Path, mapping or MoEModel
        A preset name (see :func:`model_preset`), a path ending in ``.toml`` holding one model
        table (as :func:`model_from_dict` reads), a mapping of that form, or a :class:`MoEModel`
        (returned unchanged).

    Returns
    -------
    MoEModel
        The model.

    Raises
    ------
    ConfigError
        For a missing TOML file, an unknown preset or an invalid table.
    """
    if isinstance(spec, MoEModel):
        return spec
    if isinstance(spec, Mapping):
        return model_from_dict(spec)
    path = Path(spec)
    if path.suffix == ".toml":
        if not path.is_file():
            raise ConfigError("model", f"file {str(path)!r} does not exist")
        with path.open("rb") as fh:
            return model_from_dict(tomllib.load(fh), where=path.name)
    return model_preset(str(spec))
