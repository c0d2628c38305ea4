"""The hardware of the catalog as dataclasses (GPU, Node, Fabric, Storage, prices) and
how one catalog entry becomes one.

The catalog (``topologies/catalog/*.yaml``) keeps every figure in its datasheet unit
(``nic_gbit_per_s``, ``hbm_tbyte_per_s``, ...) next to its ``source:``. The entry readers
here (``_gpu``, ``_node``, ...) convert each figure once into SI units (bytes, bytes/s,
FLOP/s, seconds, watts) so that nothing downstream deals with bits versus bytes again.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

GIB = 1024**3
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8", "mxfp8", "nvfp4", "fp6")


class CatalogError(ValueError):
    """A catalog or profile file is missing, malformed or names something unknown."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EfficiencyCurve:
    """Achieved fraction of peak as a function of work size, piecewise linear in log10(size).

    ``points`` are ``(size, efficiency)`` pairs sorted by size; sizes below the first
    or above the last point take the end values.
    """

    points: tuple[tuple[float, float], ...]
    source: str = ""

    def at(self, size: float) -> float:
        pts = self.points
        if size <= pts[0][0]:
            return pts[0][1]
        if size >= pts[-1][0]:
            return pts[-1][1]
        x = math.log10(size)
        for (s0, e0), (s1, e1) in zip(pts, pts[1:]):
            if size <= s1:
                x0, x1 = math.log10(s0), math.log10(s1)
                return e0 + (e1 - e0) * (x - x0) / (x1 - x0)
        return pts[-1][1]  # unreachable: size < pts[-1][0] here


@dataclass(frozen=True, slots=True, kw_only=True)
class GPU:
    """One accelerator (or, for ``localhost``, the calibrated host device)."""

    name: str
    description: str
    vendor: str
    peak_flops: tuple[tuple[str, float | None], ...]
    """Dense peak FLOP/s per precision name; None where the device does not support it."""
    hbm_bytes: float
    hbm_bytes_per_s: float
    intra_link: str
    intra_link_bytes_per_s: float
    """GPU-to-GPU link bandwidth per GPU, per direction."""
    pcie_gen: int
    pcie_bytes_per_s: float
    """PCIe link bandwidth per direction (the host link, and the NICs' path)."""
    tdp_w: float
    source: str
    compute_capability: float = 0.0
    """CUDA compute capability (NVIDIA GPUs; 0 elsewhere): which GEMM layouts and formats
    the stack's kernels take (``non_tn_fp8``)."""
    host_link_bytes_per_s: float = 0.0
    """The link to host memory per direction where it is not PCIe (NVLink-C2C on Grace
    superchips); 0: the PCIe link."""
    calibrated: bool = False
    efficiency_json: str = ""
    """A calibrated profile's efficiency entry (JSON text, so the GPU stays hashable);
    empty for catalog GPUs, whose entry lives in ``efficiency.yaml``."""
    gaps: tuple[str, ...] = ()
    """Catalog keys no stored source gives a figure for (``gaps:`` in gpus.yaml); each reads
    as NaN here, never as an invented number (SOURCES.md, 'Accelerators beside the GPUs')."""

    def peak(self, precision: str) -> float | None:
        return dict(self.peak_flops).get(precision)

    @property
    def host_bytes_per_s(self) -> float:
        """Bandwidth per direction between this GPU and host memory."""
        return self.host_link_bytes_per_s or self.pcie_bytes_per_s

    @property
    def non_tn_fp8(self) -> bool:
        """Whether FP8 GEMMs take every operand layout (Blackwell: compute capability 10.x and
        11.x, 13.x and on), so that Transformer Engine keeps no transposed copy of a per-tensor
        scaled FP8 tensor (transformer_engine/pytorch/utils.py ``is_non_tn_fp8_gemm_supported``;
        tensor/float8_tensor.py ``update_usage``: ``needs_data_transpose = False``). Hopper
        and Ada take only TN layouts, and TE writes the transpose beside the data."""
        cc = self.compute_capability
        return 10.0 <= cc < 12.0 or cc >= 13.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Fabric:
    """The inter-node compute network."""

    name: str
    description: str
    nic_bytes_per_s: float
    """Per NIC, per direction."""
    latency_s: float
    topology: str
    oversubscription: float
    switch_radix: int
    source: str
    gaps: tuple[str, ...] = ()
    """Catalog keys no stored source gives (NaN here), as ``GPU.gaps``."""
    judgements: tuple[str, ...] = ()
    """Catalog keys whose figure is a judgement, not a source's (SOURCES.md gives the reasons); an
    answer that rests on them says so (``procure_answer``)."""

    def judged_between(self, gpus: int, domain: int) -> bool:
        """Whether ``gpus`` in domains of ``domain`` talk over this fabric while its figures are judgements
        (the intervals and the answers of such a job say so: ``uncertainty.residual_kind``, ``procure_answer``)."""
        return bool(self.judgements) and gpus > domain


@dataclass(frozen=True, slots=True, kw_only=True)
class Storage:
    """A storage tier: local NVMe (figures per node), a parallel file system or an object store."""

    name: str
    description: str
    kind: str
    read_bytes_per_s: float
    write_bytes_per_s: float
    per_client_bytes_per_s: float
    latency_s: float
    source: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """A server: its GPUs, how they are joined, and its NICs and host."""

    name: str
    description: str
    gpu: GPU
    gpus_per_node: int
    intra: str
    fabric: str | None
    nics_per_node: int
    pcie_switches: int
    host_memory_bytes: float
    cpu_cores: int
    system_power_w: float
    storage: str
    source: str
    calibrated: bool = False
    nvlink_domain_gpus: int = 0
    """GPUs joined by one NVLink switch fabric when it spans several nodes (a GB200/GB300
    NVL72 rack: 72 GPUs over 18 compute trays of 4), or by one torus (``intra: torus``: the
    largest slice, a TPU pod's ICI); 0: the node's own GPUs."""
    torus_dims: int = 0
    """``intra: torus``: the chips of a domain form a torus of this many dimensions (TPU v4,
    v5p, TPU7x: 3; v5e, v6e, Trn1/Trn2 instances: 2; ``simcore.model.torus``); 0: no torus."""
    torus_wrap: int = 0
    """An axis whose length is a multiple of this has its wraparound link (TPU v5e/v6e: 16;
    the 4x4 Trainium torus: 4; OCS cubes: 4)."""
    torus_wrap_all: bool = False
    """Wraparounds only when EVERY axis is such a multiple (whole 4x4x4 cubes joined by
    optical switches on TPU v4/v5p/TPU7x: a 2x2x4 slice has none)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuPrice:
    on_demand_usd: float
    reserved_usd: float
    spot_usd: float
    source: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Prices:
    """Editable price, energy and failure defaults."""

    gpus: dict[str, GpuPrice]
    usd_per_kwh: float
    pue: float
    energy_source: str
    interruptions_per_gpu_hour: float
    restart_s: float
    spot_preemptions_per_hour: float
    failures_source: str
    spot_notice_s: float = 0.0
    spot_elastic_restart_s: float = 0.0
    spot_reacquire_s: float = 0.0
    spot_availability: float = 0.99
    spot_source: str = ""
    purchase: dict = field(default_factory=dict)
    """prices.yaml ``purchase``: buying instead of renting, read and checked by
    ``simcore.planner.prices.buy_sheet`` (its figures are inputs a candidates file overrides)."""


def _num(entry: dict, key: str, where: str, *, allow_none: bool = False) -> float | None:
    value = entry.get(key)
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CatalogError(f"{where}.{key} must be a number, got {value!r}")
    return float(value)


def _gap_num(e: dict, key: str, where: str, gaps: tuple[str, ...]) -> float:
    """A figure, or NaN where the entry lists ``key`` among its ``gaps`` and leaves it out."""
    if key in gaps and e.get(key) is None:
        return math.nan
    return _num(e, key, where)


def _gaps(e: dict, where: str) -> tuple[str, ...]:
    gaps = e.get("gaps") or []
    if not isinstance(gaps, list) or not all(isinstance(g, str) for g in gaps):
        raise CatalogError(f"{where}.gaps must be a list of catalog keys")
    return tuple(gaps)


def _gpu(name: str, e: dict, calibrated: bool = False, efficiency: dict | None = None) -> GPU:
    where = f"gpus.{name}"
    gaps = _gaps(e, where)
    tflops = e.get("dense_tflops") or {}
    peaks = tuple((p, None if tflops.get(p) is None else float(tflops[p]) * 1e12) for p in PRECISIONS)
    return GPU(
        name=name,
        description=str(e.get("description", name)),
        vendor=str(e.get("vendor", "")),
        peak_flops=peaks,
        hbm_bytes=_gap_num(e, "hbm_gib", where, gaps) * GIB,
        hbm_bytes_per_s=_gap_num(e, "hbm_tbyte_per_s", where, gaps) * 1e12,
        intra_link=str(e.get("intra_link", "pcie")),
        intra_link_bytes_per_s=_gap_num(e, "intra_link_gbyte_per_s_bidir", where, gaps) * 1e9 / 2,
        pcie_gen=int(e.get("pcie_gen") or 0),
        pcie_bytes_per_s=_gap_num(e, "pcie_gbyte_per_s_bidir", where, gaps) * 1e9 / 2,
        host_link_bytes_per_s=(_num(e, "host_link_gbyte_per_s_bidir", where, allow_none=True) or 0.0) * 1e9 / 2,
        tdp_w=_gap_num(e, "tdp_w", where, gaps),
        source=str(e.get("source", "")),
        compute_capability=_num(e, "compute_capability", where, allow_none=True) or 0.0,
        calibrated=calibrated,
        efficiency_json=json.dumps(efficiency, sort_keys=True) if efficiency else "",
        gaps=gaps,
    )


def _node(name: str, e: dict, gpus: dict[str, GPU], gpu: GPU | None = None) -> Node:
    where = f"nodes.{name}"
    if gpu is None:
        if e.get("gpu") not in gpus:
            raise CatalogError(f"{where}.gpu '{e.get('gpu')}' is not in gpus.yaml")
        gpu = gpus[e["gpu"]]
    return Node(
        name=name,
        description=str(e.get("description", name)),
        gpu=gpu,
        gpus_per_node=int(e["gpus_per_node"]),
        intra=str(e.get("intra", "pcie")),
        fabric=e.get("fabric"),
        nics_per_node=int(e.get("nics_per_node") or 0),
        pcie_switches=int(e.get("pcie_switches") or 0),
        host_memory_bytes=(_num(e, "host_memory_gib", where, allow_none=True) or 0.0) * GIB,
        cpu_cores=int(e.get("cpu_cores") or 0),
        system_power_w=_num(e, "system_power_w", where, allow_none=True) or 0.0,
        storage=str(e.get("storage", "local-nvme")),
        source=str(e.get("source", "")),
        calibrated=bool(e.get("calibrated", False)),
        nvlink_domain_gpus=_domain(e, where),
        **_torus(e, where),
    )


def _domain(e: dict, where: str) -> int:
    """``nvlink_domain_gpus`` of a node entry: absent or a whole number of its nodes."""
    domain = int(e.get("nvlink_domain_gpus") or 0)
    gpn = int(e.get("gpus_per_node") or 0)
    if domain and (gpn <= 0 or domain % gpn or e.get("intra") not in ("nvswitch", "torus")):
        raise CatalogError(f"{where}.nvlink_domain_gpus={domain} must be a multiple of gpus_per_node "
                           "on a node whose intra is nvswitch or torus")
    return domain


def _torus(e: dict, where: str) -> dict:
    """``torus: {dims, wrap, wrap_all}`` of a node whose ``intra`` is torus."""
    t = e.get("torus")
    if e.get("intra") != "torus":
        if t is not None:
            raise CatalogError(f"{where}.torus is given but intra is {e.get('intra')!r}, not torus")
        return {}
    if not isinstance(t, dict) or int(t.get("dims") or 0) not in (1, 2, 3) or int(t.get("wrap") or 0) < 1:
        raise CatalogError(f"{where}.torus must give dims (1-3) and wrap (an axis length) on an intra: torus node")
    return {"torus_dims": int(t["dims"]), "torus_wrap": int(t["wrap"]), "torus_wrap_all": bool(t.get("wrap_all", False))}


def _fabric(name: str, e: dict) -> Fabric:
    where = f"fabrics.{name}"
    gaps = _gaps(e, where)
    return Fabric(
        name=name,
        description=str(e.get("description", name)),
        nic_bytes_per_s=_gap_num(e, "nic_gbit_per_s", where, gaps) * 1e9 / 8,
        latency_s=_gap_num(e, "latency_us", where, gaps) * 1e-6,
        topology=str(e.get("topology", "fat-tree")),
        oversubscription=_gap_num(e, "oversubscription", where, gaps),
        switch_radix=int(e.get("switch_radix") or 64),
        source=str(e.get("source", "")),
        gaps=gaps,
        judgements=tuple(str(k) for k in e.get("judgements") or ()),
    )


def _storage(name: str, e: dict) -> Storage:
    where = f"storage.{name}"
    return Storage(
        name=name,
        description=str(e.get("description", name)),
        kind=str(e.get("kind")),
        read_bytes_per_s=_num(e, "read_gbyte_per_s", where) * 1e9,
        write_bytes_per_s=_num(e, "write_gbyte_per_s", where) * 1e9,
        per_client_bytes_per_s=_num(e, "per_client_gbyte_per_s", where) * 1e9,
        latency_s=_num(e, "latency_ms", where) * 1e-3,
        source=str(e.get("source", "")),
    )


def _prices(e: dict) -> Prices:
    energy, failures = e.get("energy", {}), e.get("failures", {})
    gpus = {
        name: GpuPrice(
            on_demand_usd=float(p["on_demand_usd"]),
            reserved_usd=float(p["reserved_usd"]),
            spot_usd=float(p["spot_usd"]),
            source=str(p.get("source", "")),
        )
        for name, p in (e.get("gpus") or {}).items()
    }
    return Prices(
        gpus=gpus,
        usd_per_kwh=_num(energy, "usd_per_kwh", "prices.energy"),
        pue=_num(energy, "pue", "prices.energy"),
        energy_source=str(energy.get("source", "")),
        interruptions_per_gpu_hour=_num(failures, "interruptions_per_gpu_hour", "prices.failures"),
        restart_s=_num(failures, "restart_minutes", "prices.failures") * 60,
        spot_preemptions_per_hour=_num(failures, "spot_preemptions_per_hour", "prices.failures"),
        failures_source=str(failures.get("source", "")),
        **_spot(e.get("spot") or {}),
        purchase=dict(e.get("purchase") or {}),
    )


def _spot(spot: dict) -> dict:
    """How spot runs are operated (prices.yaml ``spot``): notice, elastic restart, reacquisition."""
    if not spot:
        return {}
    return {"spot_notice_s": _num(spot, "notice_s", "prices.spot"),
            "spot_elastic_restart_s": _num(spot, "elastic_restart_minutes", "prices.spot") * 60,
            "spot_reacquire_s": _num(spot, "reacquire_minutes", "prices.spot") * 60,
            "spot_availability": _num(spot, "availability", "prices.spot"),
            "spot_source": str(spot.get("source", ""))}


#: PyYAML's safe loader on libyaml's parser where the wheel has it (the same resolver and
#: constructors in Python, so the same values; a tenth of the pure-Python parser's time).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read_yaml(path: Path) -> dict:
    try:
        with open(path) as f:
            data = yaml.load(f, Loader=_LOADER)
    except OSError as exc:
        raise CatalogError(f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise CatalogError(f"{path} must hold a mapping at the top level")
    return data
