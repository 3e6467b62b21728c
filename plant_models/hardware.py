"""Accelerator descriptors: the hardware half of every service rate.

Each preset is one GPU as it sits in its scale-up domain (an HGX board of 8, or an NVL72 rack).
All figures are per GPU, *dense* (vendor "with sparsity" tensor figures halved), in SI units:
bytes, bytes/s, FLOP/s, watts. Link bandwidths are per direction (datasheet NVLink figures are
bidirectional totals, so they are halved here).

Sources (vendor datasheets, read 2025):

* H100 SXM5  - NVIDIA H100 Tensor Core GPU datasheet: 80 GB HBM3, 3.35 TB/s, BF16 989 TFLOPS and
  FP8 1,979 TFLOPS dense, NVLink 900 GB/s bidirectional, up to 700 W. HGX H100 / DGX H100 pair each
  GPU with a ConnectX-7 400 Gb/s NIC.
* H800 SXM5  - NVIDIA H800 Tensor Core GPU datasheet (the export variant of H100 SXM5): 80 GB
  HBM3 at 3.35 TB/s, tensor throughput as H100 SXM (FP8 1,979 / BF16 989 TFLOPS dense), NVLink
  cut to 400 GB/s bidirectional, 700 W. DeepSeek-V3 Technical Report (arXiv:2412.19437, section
  3.2.2): one 400 Gb/s InfiniBand NIC (~50 GB/s) per H800 in DeepSeek's serving nodes.
* H200 SXM   - NVIDIA H200 datasheet: 141 GB HBM3e, 4.8 TB/s; tensor throughput as H100 SXM;
  NVLink 900 GB/s; up to 700 W; ConnectX-7 400 Gb/s per GPU on HGX H200.
* B200       - NVIDIA HGX B200 / DGX B200 datasheet: 8 GPUs, 1,440 GB HBM3e (180 GB each),
  64 TB/s (8 TB/s each); FP4 144 PF / FP8 72 PF / BF16 36 PF per board with sparsity, i.e.
  9 / 4.5 / 2.25 PFLOPS dense per GPU; NVLink 5 1.8 TB/s bidirectional per GPU; 1,000 W per GPU;
  ConnectX-7 400 Gb/s per GPU.
* B300       - NVIDIA HGX B300 datasheet (Blackwell Ultra): 288 GB HBM3e and 8 TB/s per GPU;
  FP4 105 PF dense per 8-GPU board (13.1 PF each), FP8 and BF16 as B200 (4.5 / 2.25 PF dense);
  NVLink 5 1.8 TB/s; ConnectX-8 800 Gb/s per GPU; 1,100 W per GPU on HGX.
* GB200      - NVIDIA GB200 NVL72 datasheet: 72 GPUs, 13.4 TB HBM3e (186 GB each) at 576 TB/s
  (8 TB/s each); FP4 1,440 PF / FP8 720 PF / BF16 360 PF per rack with sparsity, i.e.
  10 / 5 / 2.5 PFLOPS dense per GPU; NVLink 5 1.8 TB/s per GPU across the 72-GPU domain;
  ConnectX-7 400 Gb/s per GPU; ~1,200 W per GPU.

Host memory and local SSD (the KV tiers below HBM, article sections 2, 20 and 22), per GPU = the
node's figure / its GPUs; the host-to-HBM bandwidth is the GPU's host link per direction:

* H100 SXM, H200 - NVIDIA DGX H100/H200 datasheet: 2 TB system memory and 8 x 3.84 TB NVMe U.2
  data drives per 8-GPU node (250 GB and 3.84 TB per GPU); H100/H200 datasheets: PCIe Gen5
  128 GB/s (64 GB/s per direction) per GPU, below the node's DDR5 (2 sockets x 8 channels x
  DDR5-4800 = 614 GB/s, 77 GB/s per GPU). SSD read: 7 GB/s per drive, one drive per GPU, an
  ASSUMPTION of a PCIe Gen4 U.2 data-centre drive's sequential read (Samsung PM1733 datasheet:
  7,000 MB/s); DeepSeek's 3FS reports KV-cache reads of up to ~40 GiB/s per client node
  (deepseek-ai/3FS README), the same order per node.
* H800 - the DGX H100 figures (ASSUMPTION: HGX H800 nodes are built like HGX H100).
* B200 - NVIDIA DGX B200 datasheet: 2 TB system memory (up to 4 TB), 8 x 3.84 TB NVMe U.2;
  PCIe Gen5 x16 host link per GPU (64 GB/s per direction); SSD read as H200 (ASSUMPTION).
* B300 - the DGX B200 figures (ASSUMPTION: NVIDIA's HGX B300 material gives no system-memory or
  drive complement comparable to the DGX B200 datasheet's).
* GB200 - NVIDIA GB200 NVL72 datasheet: up to 17 TB LPDDR5X at 18.4 TB/s per rack, i.e. 480 GB
  and 512 GB/s per Grace CPU shared by its two GPUs (240 GB, 256 GB/s each), over NVLink-C2C
  (900 GB/s bidirectional per superchip: 225 GB/s per GPU per direction, the binding figure).
  Local SSD: 4 x 3.84 TB E1.S per 4-GPU compute tray at 7 GB/s each (ASSUMPTION: tray storage
  varies by OEM).
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenfactory.core.validation import (REQUIRED, ConfigError, check_fields, check_number, reject_unknown_keys,
                                          setting, setting_names)

__all__ = [
    "PRECISIONS",
    "Accelerator",
    "ACCELERATOR_PRESETS",
    "accelerator_preset",
    "accelerator_from_dict",
    "HARDWARE_SCHEMA",
    "load_accelerator",
]

#: Bytes per element of each number format we model (block-scale overhead of FP8/FP4 ignored).
PRECISIONS: dict[str, float] = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5}

GB = 1e9
TB = 1e12
_BY_WIDTH = sorted(PRECISIONS, key=PRECISIONS.get)  # narrowest format first
#: fields a hardware description may leave out (the KV tiers below HBM)
OPTIONAL_FIELDS = ("host_memory_bytes", "host_memory_bandwidth", "ssd_bytes", "ssd_bandwidth")


@dataclass(frozen=True)
class Accelerator:
    """One GPU in its scale-up domain.

    Attributes
    ----------
    name : preset or user name.
    hbm_bytes : HBM capacity per GPU.
    hbm_bandwidth : HBM bandwidth per GPU, bytes/s.
    dense_flops : dense tensor FLOP/s per precision (keys among ``PRECISIONS``).
    scale_up_bandwidth : NVLink bandwidth per GPU per direction, bytes/s.
    scale_out_bandwidth : NIC bandwidth per GPU per direction, bytes/s.
    scale_up_domain : GPUs in one NVLink domain (8 for HGX boards, 72 for NVL72).
    power_watts : board power per GPU.
    source : where the figures come from.
    host_memory_bytes : host DRAM per GPU (the node's / its GPUs; None = not described).
    host_memory_bandwidth : host DRAM to HBM per GPU per direction, bytes/s (the GPU's host link).
    ssd_bytes : local NVMe per GPU (None = not described).
    ssd_bandwidth : local NVMe read per GPU, bytes/s.
    """

    name: str = setting(REQUIRED, kind=str, meaning="the accelerator's name (in reports)")
    hbm_bytes: float = setting(REQUIRED, unit="bytes", low=0.0, low_inclusive=False, meaning="HBM capacity per GPU")
    hbm_bandwidth: float = setting(REQUIRED, unit="bytes/s", low=0.0, low_inclusive=False,
                                   meaning="HBM bandwidth per GPU")
    dense_flops: Mapping[str, float] = setting(REQUIRED, kind="table", unit="FLOP/s", choices=tuple(PRECISIONS),
                                               meaning="dense tensor FLOP/s per GPU by precision, e.g. "
                                                       "{fp8 = 1.979e15, bf16 = 9.89e14}; at least one; a format "
                                                       "the GPU lacks runs at the next wider one")
    scale_up_bandwidth: float = setting(REQUIRED, unit="bytes/s", low=0.0, low_inclusive=False,
                                        meaning="NVLink (scale-up) bandwidth per GPU per direction")
    scale_out_bandwidth: float = setting(REQUIRED, unit="bytes/s", low=0.0, low_inclusive=False,
                                         meaning="NIC (scale-out) bandwidth per GPU per direction")
    scale_up_domain: int = setting(REQUIRED, kind=int, low=1, unit="GPUs",
                                   meaning="GPUs in one NVLink domain (8 for HGX boards, 72 for NVL72)")
    power_watts: float = setting(REQUIRED, unit="W", low=0.0, low_inclusive=False, meaning="board power per GPU")
    source: str = setting("", kind=str, meaning="where the figures come from (a datasheet URL)")
    host_memory_bytes: float | None = setting(None, unit="bytes", low=0.0, low_inclusive=False,
                                              meaning="host DRAM per GPU, a KV tier below HBM (absent: not "
                                                      "described)")
    host_memory_bandwidth: float | None = setting(None, unit="bytes/s", low=0.0, low_inclusive=False,
                                                  meaning="host DRAM to HBM per GPU per direction (the GPU's host "
                                                          "link)")
    ssd_bytes: float | None = setting(None, unit="bytes", low=0.0, low_inclusive=False,
                                      meaning="local NVMe per GPU (absent: not described)")
    ssd_bandwidth: float | None = setting(None, unit="bytes/s", low=0.0, low_inclusive=False,
                                          meaning="local NVMe read bandwidth per GPU")

    def __post_init__(self) -> None:
        where = f"accelerator[{self.name}]"
        check_fields(self, where, names=("hbm_bytes", "hbm_bandwidth", "scale_up_bandwidth", "scale_out_bandwidth",
                                         "power_watts", *OPTIONAL_FIELDS, "scale_up_domain"), hold=False)
        if not self.dense_flops:
            raise ConfigError(f"{where}.dense_flops", "needs at least one precision")
        for prec, value in self.dense_flops.items():
            if prec not in PRECISIONS:
                raise ConfigError(f"{where}.dense_flops.{prec}",
                                  f"unknown precision; allowed are {', '.join(PRECISIONS)}")
            check_number(f"{where}.dense_flops.{prec}", value, low=0.0, low_inclusive=False)
        object.__setattr__(self, "dense_flops", dict(self.dense_flops))

    def peak_flops(self, precision: str) -> float:
        """Dense tensor FLOP/s for ``precision``; a format the GPU lacks runs at the next wider one."""
        if precision not in PRECISIONS:
            raise ConfigError("precision", f"{precision!r} is not one of {', '.join(PRECISIONS)}")
        # Hopper has no FP4 tensor cores: FP4 weights are upcast and run at FP8 rate.
        for p in _BY_WIDTH:
            if PRECISIONS[p] >= PRECISIONS[precision] and p in self.dense_flops:
                return self.dense_flops[p]
        raise ConfigError(f"accelerator[{self.name}].dense_flops",
                          f"no tensor rate at or above {precision}")

    def ridge_point(self, precision: str) -> float:
        """Arithmetic intensity (FLOP/byte) above which a kernel is compute-bound."""
        return self.peak_flops(precision) / self.hbm_bandwidth

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain data, plus ``ridge_point_flop_per_byte`` per precision."""
        d = dataclasses.asdict(self)
        d["ridge_point_flop_per_byte"] = {p: self.ridge_point(p) for p in self.dense_flops}
        return d


def _gpu(name: str, hbm_gb: float, bw_tbs: float, flops_pf: dict[str, float], nvlink_bidir_gbs: float,
         nic_gbit: float, domain: int, watts: float, source: str, host_gb: float, host_gbs: float,
         ssd_tb: float, ssd_gbs: float) -> Accelerator:
    return Accelerator(
        name=name,
        hbm_bytes=hbm_gb * GB,
        hbm_bandwidth=bw_tbs * TB,
        dense_flops={p: v * 1e15 for p, v in flops_pf.items()},
        scale_up_bandwidth=nvlink_bidir_gbs * GB / 2.0,
        scale_out_bandwidth=nic_gbit * 1e9 / 8.0,
        scale_up_domain=domain,
        power_watts=watts,
        source=source,
        host_memory_bytes=host_gb * GB,
        host_memory_bandwidth=host_gbs * GB,
        ssd_bytes=ssd_tb * TB,
        ssd_bandwidth=ssd_gbs * GB,
    )


#: host DRAM GB, host link GB/s, SSD TB, SSD GB/s per GPU of an 8-GPU DGX/HGX node (module notes)
_DGX_HOST = dict(host_gb=250, host_gbs=64, ssd_tb=3.84, ssd_gbs=7)


ACCELERATOR_PRESETS: dict[str, Accelerator] = {
    a.name: a
    for a in (
        _gpu("h100-sxm", 80, 3.35, {"bf16": 0.989, "fp8": 1.979}, 900, 400, 8, 700,
             "NVIDIA H100 Tensor Core GPU datasheet (SXM5); HGX H100 ConnectX-7 400 Gb/s per GPU", **_DGX_HOST),
        _gpu("h800", 80, 3.35, {"bf16": 0.989, "fp8": 1.979}, 400, 400, 8, 700,
             "NVIDIA H800 Tensor Core GPU datasheet (SXM5); DeepSeek-V3 Technical Report: "
             "400 Gb/s InfiniBand per GPU", **_DGX_HOST),
        _gpu("h200", 141, 4.8, {"bf16": 0.989, "fp8": 1.979}, 900, 400, 8, 700,
             "NVIDIA H200 Tensor Core GPU datasheet (SXM); HGX H200 ConnectX-7 400 Gb/s per GPU", **_DGX_HOST),
        _gpu("b200", 180, 8.0, {"bf16": 2.25, "fp8": 4.5, "fp4": 9.0}, 1800, 400, 8, 1000,
             "NVIDIA HGX B200 / DGX B200 datasheet (per-board figures / 8, sparsity halved)", **_DGX_HOST),
        _gpu("b300", 288, 8.0, {"bf16": 2.25, "fp8": 4.5, "fp4": 13.1}, 1800, 800, 8, 1100,
             "NVIDIA HGX B300 datasheet (per-board figures / 8); ConnectX-8 800 Gb/s per GPU", **_DGX_HOST),
        _gpu("gb200", 186, 8.0, {"bf16": 2.5, "fp8": 5.0, "fp4": 10.0}, 1800, 400, 72, 1200,
             "NVIDIA GB200 NVL72 datasheet (per-rack figures / 72, sparsity halved)",
             host_gb=240, host_gbs=225, ssd_tb=3.84, ssd_gbs=7),
    )
}


def accelerator_preset(name: str) -> Accelerator:
    """The preset called ``name`` (case-insensitive).

    Parameters
    ----------
    name : str
        One of :data:`ACCELERATOR_PRESETS`: ``h100-sxm``, ``h800``, ``h200``, ``b200``, ``b300``,
        ``gb200`` (sources in the module docstring).

    Returns
    -------
    Accelerator
        The preset (per-GPU figures, SI units).

    Raises
    ------
    ConfigError
        For an unknown name (field ``hardware``; the message lists the presets).
    """
    key = name.lower()
    if key not in ACCELERATOR_PRESETS:
        raise ConfigError("hardware", f"unknown preset {name!r}; presets are "
                          f"{', '.join(ACCELERATOR_PRESETS)}")
    return ACCELERATOR_PRESETS[key]


_FIELDS = set(setting_names(Accelerator))
#: the keys of a hardware table (``plant.hardware`` or a hardware TOML): the Accelerator fields and ``base``
HARDWARE_SCHEMA = {"base": setting(None, kind=str, choices=tuple(ACCELERATOR_PRESETS),
                                   meaning="a preset to start from: the other keys override its fields; without it "
                                           "every field but source and the KV tiers is required"),
                   **{f.name: f for f in dataclasses.fields(Accelerator)}}


def accelerator_from_dict(d: Mapping[str, Any], where: str = "hardware") -> Accelerator:
    """Build an accelerator from a mapping with the dataclass field names (SI units).

    ``base = "h200"`` starts from a preset and overrides only the given keys.

    Parameters
    ----------
    d : mapping
        Keys among the :class:`Accelerator` fields (``hbm_bytes`` in bytes, ``hbm_bandwidth``,
        ``scale_up_bandwidth`` and ``scale_out_bandwidth`` in bytes/s per direction,
        ``dense_flops`` as {precision: FLOP/s}, ``scale_up_domain`` in GPUs, ``power_watts`` in W,
        ``name``, ``source``) plus an optional ``base`` preset name. Without ``base`` every field
        but ``source`` is required.
    where : str
        Dotted path of the table, used in error messages (default ``"hardware"``).

    Returns
    -------
    Accelerator
        The validated accelerator.

    Raises
    ------
    ConfigError
        For an unknown key, an unknown ``base``, a missing field or a value outside its range.
    """
    d = dict(d)
    reject_unknown_keys(where, d, HARDWARE_SCHEMA)
    base = d.pop("base", None)
    if base is not None:
        merged = dataclasses.asdict(accelerator_preset(base))
        merged.update(d)
        d = merged
    missing = sorted(_FIELDS - {"source", *OPTIONAL_FIELDS} - set(d))
    if missing:
        raise ConfigError(f"{where}.{missing[0]}", "missing (give it, or start from base = PRESET)")
    return Accelerator(**d)


def load_accelerator(spec: str | Path | Mapping[str, Any] | Accelerator) -> Accelerator:
    """A preset name, a TOML file path, a mapping, or an :class:`Accelerator` as-is.

    Parameters
    ----------
    spec : str, pathlib.Path, mapping or Accelerator
        A preset name (see :func:`accelerator_preset`), a path ending in ``.toml`` holding one
        accelerator table (as :func:`accelerator_from_dict` reads), a mapping of that form, or an
        :class:`Accelerator` (returned unchanged).

    Returns
    -------
    Accelerator
        The accelerator.

    Raises
    ------
    ConfigError
        For a missing TOML file, an unknown preset or an invalid table.
    """
    if isinstance(spec, Accelerator):
        return spec
    if isinstance(spec, Mapping):
        return accelerator_from_dict(spec)
    path = Path(spec)
    if path.suffix == ".toml":
        if not path.is_file():
            raise ConfigError("hardware", f"file {str(path)!r} does not exist")
        with path.open("rb") as fh:
            return accelerator_from_dict(tomllib.load(fh), where=f"{path.name}")
    return accelerator_preset(str(spec))
