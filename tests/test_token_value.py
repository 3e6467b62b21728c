"""The decode value sweep: tokens/s x the price of the TPOT each batch gives."""

from tokenfactory.plant_models import Worker
from tokenfactory.plant_models.token_value import TokenValue, best_decode_batch, decode_value_sweep


def test_value_sweep_is_a_table_and_its_best_batch_is_in_it():
    w = Worker.from_dict({"model": "deepseek-v3", "hardware": "h200"})
    df = decode_value_sweep(w, 8192, TokenValue())
    assert len(df) > 5 and df["batch"].is_monotonic_increasing
    best = best_decode_batch(w, 8192, TokenValue())
    assert best["value_batch"] in set(df["batch"]) and best["value_batch"] <= best["decode_slots"]
    top = df.loc[df["revenue_per_gpu_hour"].idxmax()]
    assert best["value_batch"] == top["batch"]
