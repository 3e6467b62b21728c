import pytest

from tokenfactory.plant_models import kv_crossover_depth, model_preset, stage_memory, stage_memory_sweep
from tokenfactory import ConfigError


def test_article_section14_example():
    # 70 kB/token x 2M active tokens = 140 GB; double buffering -> 280 GB.
    single = stage_memory(0, 1, 2e6, 70e3, double_buffer=False)
    double = stage_memory(0, 1, 2e6, 70e3, double_buffer=True)
    assert single.kv == pytest.approx(140e9)
    assert double.kv == pytest.approx(280e9)


def test_frontier_stage_lands_in_400_500_GB_target():
    # DeepSeek-V3 FP8 weights, 280 GB double-buffered KV, 20 GB working memory, P = 4.
    w = model_preset("deepseek-v3").weight_bytes
    st = stage_memory(w, 4, 2e6, 70e3, working_bytes=20e9)
    assert 400e9 <= st.total <= 500e9


def test_kv_does_not_shrink_with_depth_and_crossover():
    w = 671e9
    df = stage_memory_sweep(w, 2e6, 70e3, depths=range(1, 9), working_bytes=20e9)
    assert df["kv"].nunique() == 1
    p = kv_crossover_depth(w, 2e6, 70e3, working_bytes=20e9)
    assert p == 3  # 671/3 = 224 GB <= 300 GB, 671/2 = 336 GB > 300 GB
    assert w / p <= 300e9 < w / (p - 1)


def test_bad_depth():
    with pytest.raises(ConfigError, match="pipeline_depth"):
        stage_memory(1e9, 0, 1e6, 70e3)
