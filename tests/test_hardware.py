import pytest

from tokenfactory.plant_models import ACCELERATOR_PRESETS, accelerator_from_dict, accelerator_preset, load_accelerator
from tokenfactory import ConfigError

# (preset, HBM GB, HBM TB/s, dense FP8 PFLOPS, scale-up domain) from the vendor datasheets cited
# in plant_models/hardware.py.
DATASHEET = [
    ("h100-sxm", 80, 3.35, 1.979, 8),
    ("h200", 141, 4.8, 1.979, 8),
    ("b200", 180, 8.0, 4.5, 8),
    ("b300", 288, 8.0, 4.5, 8),
    ("gb200", 186, 8.0, 5.0, 72),
]


@pytest.mark.parametrize("name,hbm,bw,fp8,domain", DATASHEET)
def test_presets_match_datasheets(name, hbm, bw, fp8, domain):
    a = accelerator_preset(name)
    assert a.hbm_bytes == pytest.approx(hbm * 1e9)
    assert a.hbm_bandwidth == pytest.approx(bw * 1e12)
    assert a.peak_flops("fp8") == pytest.approx(fp8 * 1e15)
    assert a.scale_up_domain == domain
    assert a.source


def test_every_preset_has_bf16_and_fp8_and_blackwell_has_fp4():
    for a in ACCELERATOR_PRESETS.values():
        assert {"bf16", "fp8"} <= set(a.dense_flops)
    for name in ("b200", "b300", "gb200"):
        assert "fp4" in accelerator_preset(name).dense_flops


def test_hopper_runs_fp4_at_fp8_rate():
    h = accelerator_preset("h200")
    assert h.peak_flops("fp4") == h.peak_flops("fp8")


def test_ridge_point():
    assert accelerator_preset("h200").ridge_point("fp8") == pytest.approx(1.979e15 / 4.8e12)


@pytest.mark.parametrize("d,field", [
    ({"base": "h200", "hbm_bytes": -5}, "hbm_bytes"),
    ({"base": "h200", "scale_up_domain": 0}, "scale_up_domain"),
    ({"base": "h200", "dense_flops": {"fp6": 1e15}}, "dense_flops.fp6"),
    ({"base": "h200", "hbm_size": 1}, "hardware.hbm_size"),
    ({"name": "x"}, "hardware."),
])
def test_bad_hardware_names_the_field(d, field):
    with pytest.raises(ConfigError) as err:
        accelerator_from_dict(d)
    assert field in str(err.value)


def test_unknown_preset():
    with pytest.raises(ConfigError, match="h200"):
        load_accelerator("tpu-v9")


# (preset, host GB per GPU, host link GB/s per GPU, SSD TB per GPU): DGX H100/H200/B200 datasheets
# (2 TB and 8 x 3.84 TB NVMe per 8-GPU node, PCIe Gen5 x16), GB200 NVL72 (480 GB LPDDR5X per Grace
# for two GPUs, NVLink-C2C 900 GB/s bidirectional); see plant_models/hardware.py
HOST = [("h100-sxm", 250, 64, 3.84), ("h200", 250, 64, 3.84), ("b200", 250, 64, 3.84), ("gb200", 240, 225, 3.84)]


@pytest.mark.parametrize("name,host_gb,link_gbs,ssd_tb", HOST)
def test_host_memory_and_ssd_per_gpu(name, host_gb, link_gbs, ssd_tb):
    a = accelerator_preset(name)
    assert a.host_memory_bytes == pytest.approx(host_gb * 1e9)
    assert a.host_memory_bandwidth == pytest.approx(link_gbs * 1e9)
    assert a.ssd_bytes == pytest.approx(ssd_tb * 1e12)
    assert a.ssd_bandwidth > 0


def test_host_memory_and_ssd_are_optional_in_a_description():
    d = {k: v for k, v in accelerator_preset("h200").to_dict().items()
         if k not in ("ridge_point_flop_per_byte", "host_memory_bytes", "host_memory_bandwidth", "ssd_bytes",
                      "ssd_bandwidth")}
    a = accelerator_from_dict({**d, "name": "bare"})
    assert a.host_memory_bytes is None and a.ssd_bandwidth is None
    with pytest.raises(ConfigError, match="ssd_bandwidth"):
        accelerator_from_dict({"base": "h200", "ssd_bandwidth": -1.0})
