import pytest

from tokenfactory.plant_models import MODEL_PRESETS, AttentionSpec, MoEModel, load_model, model_from_dict, model_preset
from tokenfactory import ConfigError

# Published totals: DeepSeek-V3 technical report (671B / 37B), Kimi K2 model card (1.04T / 32B).
PUBLISHED = [
    ("deepseek-v3", 671e9, 37e9),
    ("kimi-k2", 1.04e12, 32e9),
]


@pytest.mark.parametrize("name,total,active", PUBLISHED)
def test_published_parameter_totals_within_5_percent(name, total, active):
    m = model_preset(name)
    assert m.total_params == pytest.approx(total, rel=0.05)
    assert m.active_params == pytest.approx(active, rel=0.05)


def test_deepseek_v3_mla_kv_bytes_per_token():
    # 61 layers x (kv_lora_rank 512 + rope 64) x 2 bytes (BF16)
    assert model_preset("deepseek-v3").kv_bytes_per_token == 61 * (512 + 64) * 2 == 70_272


def test_hybrid_preset_is_about_25kB_and_labelled_an_assumption():
    m = model_preset("hybrid-25k")
    assert m.kv_bytes_per_token == pytest.approx(25e3, rel=0.05)
    assert "ASSUMPTION" in m.source
    # linear-attention layers add a fixed state per sequence, not per token
    assert m.kv_bytes(2000) - m.kv_bytes(1000) == pytest.approx(1000 * m.kv_bytes_per_token)
    assert m.kv_bytes(1) > m.kv_bytes_per_token


def test_gqa_kv_bytes_and_local_window():
    attn = AttentionSpec(kind="gqa", num_heads=32, head_dim=128, kv_heads=8,
                         full_attention_layers=8, efficient_kind="local", local_window=1024)
    m = MoEModel(name="t", num_layers=32, num_dense_layers=0, hidden_size=4096, vocab_size=32000,
                 dense_intermediate_size=0, expert_intermediate_size=1024, routed_experts=64,
                 active_experts=4, shared_experts=0, attention=attn, kv_precision="fp8")
    per_layer = 2 * 8 * 128 * 1  # K and V, 8 KV heads x 128, FP8
    assert m.kv_bytes_per_token == 8 * per_layer
    # 24 local layers hold at most the 1024-token window
    assert m.kv_bytes(10_000) == 8 * per_layer * 10_000 + 24 * per_layer * 1024


def test_routed_experts_hold_over_95_percent_of_weights():
    # Article section 14: "over 95 % of the weight memory of a large MoE is in routed experts".
    # (the large MoEs; gpt-oss-120b's BF16 attention beside FP4 experts keeps it at 93 %, and the
    # dense presets have no routed experts)
    large = [m for m in MODEL_PRESETS.values() if m.moe_layers and m.total_params > 2e11]
    assert len(large) >= 8
    for m in large:
        assert m.routed_expert_weight_bytes / m.weight_bytes > 0.95, m.name


@pytest.mark.parametrize("override,field", [
    ({"active_experts": 300}, "active_experts"),
    ({"hidden_size": -1}, "hidden_size"),
    ({"num_dense_layers": 100}, "num_dense_layers"),
    ({"weight_precision": "int3"}, "weight_precision"),
    ({"colour": "blue"}, "model.colour"),
    ({"attention": {"kv_lora_rank": 0}}, "attention.kv_lora_rank"),
    ({"attention": {"heads": 3}}, "attention.heads"),
])
def test_bad_model_fields_are_named(override, field):
    with pytest.raises(ConfigError) as err:
        model_from_dict({"base": "deepseek-v3", **override})
    assert field in str(err.value)


def test_unknown_preset_lists_presets():
    with pytest.raises(ConfigError, match="deepseek-v3"):
        load_model("gpt-7")


def test_model_from_toml_file(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('base = "deepseek-v3"\nname = "dsv3-fp4"\nweight_precision = "fp4"\n')
    m = load_model(f)
    assert m.weight_bytes == pytest.approx(model_preset("deepseek-v3").weight_bytes / 2)


def test_full_model_from_dict_requires_fields():
    with pytest.raises(ConfigError, match="model.attention"):
        model_from_dict({"name": "x"})


# -- prefill attention FLOPs under the causal mask (issue 24: the prefill cost model) -------------
def _gqa(layers_full=None, window=128):
    return MoEModel(name="t", num_layers=2, num_dense_layers=2, hidden_size=256, vocab_size=1000,
                    dense_intermediate_size=512, expert_intermediate_size=1, routed_experts=1, active_experts=1,
                    shared_experts=0,
                    attention=AttentionSpec(kind="gqa", num_heads=4, head_dim=16, kv_heads=2,
                                            full_attention_layers=layers_full, efficient_kind="local",
                                            local_window=window))


def test_causal_prefill_flops_of_a_full_layer_are_half_the_square():
    # QK^T and PV: 2 x 2 x n x attended x heads x d; causal: query i attends i tokens, sum = n (n + 1) / 2
    m, n = _gqa(), 1000
    per_layer = 4.0 * 4 * 16 * n * (n + 1) / 2
    assert m.causal_attention_core_flops(n) == pytest.approx(2 * per_layer)
    # after c cached tokens query i attends c + i
    c = 300
    assert m.causal_attention_core_flops(n, c) == pytest.approx(2 * 4.0 * 4 * 16 * (n * c + n * (n + 1) / 2))


def test_sliding_window_layer_prefill_flops_closed_form():
    # a local layer of window W: query i attends min(i, W); for n >= W the sum is W (W + 1) / 2 + (n - W) W
    n, w = 8192, 128
    m = _gqa(layers_full=1, window=w)
    full = 4.0 * 4 * 16 * n * (n + 1) / 2
    local = 4.0 * 4 * 16 * (w * (w + 1) / 2 + (n - w) * w)
    assert m.causal_attention_core_flops(n) == pytest.approx(full + local)
    # the local layer costs ~2 W / n of a full one at this n (here 3.1 %), not the same
    assert local / full == pytest.approx(2 * w / n, rel=0.02)
    # a chunk after a cache longer than the window attends W per query
    assert m.causal_attention_core_flops(512, 4096) == pytest.approx(
        4.0 * 4 * 16 * (512 * (4096 + 256.5) + 512 * w))
    # a chunk starting inside the window: c = 100, n = 50 -> queries attend 101 .. 128 then 128
    exact = sum(min(100 + i, w) for i in range(1, 51))
    assert m.causal_attention_core_flops(50, 100) == pytest.approx(
        4.0 * 4 * 16 * (50 * (100 + 25.5) + exact))


def test_gpt_oss_alternates_sliding_and_full_layers_as_its_config():
    # openai/gpt-oss-120b config.json: 36 layers, layer_types alternating sliding_attention /
    # full_attention, sliding_window 128; only the 18 full layers grow KV per token
    m = model_preset("gpt-oss-120b")
    assert (m.num_layers, m.full_attention_layers, m.attention.local_window) == (36, 18, 128)
    assert m.kv_bytes_per_token == 18 * 2 * 8 * 64 * 2
    # experts MXFP4 with MXFP8 activations (BF16 on Hopper), the rest BF16
    assert (m.weight_precision, m.expert_precision, m.expert_activation_precision) == ("bf16", "fp4", "fp8")


def test_mla_prefill_uses_the_expanded_form():
    # DeepSeek-V2/V3 MLA prefill: 128 heads x (192 qk + 128 v) per attended token and layer;
    # decode (absorbed): 128 heads x (2 x 512 + 64)
    m = model_preset("deepseek-v3")
    n = 4096
    assert m.causal_attention_core_flops(n) == pytest.approx(61 * 2.0 * 128 * (192 + 128) * n * (n + 1) / 2)
    assert m.causal_attention_core_flops(1, 999) == pytest.approx(61 * 2.0 * 128 * (2 * 512 + 64) * 1000)


def test_expert_activation_precision_is_checked_and_defaults_to_the_experts():
    assert model_preset("deepseek-v3").expert_activation_precision is None
    with pytest.raises(ConfigError, match="expert_activation_precision"):
        model_from_dict({"base": "gpt-oss-120b", "expert_activation_precision": "fp6"})
