"""Hardware dataclasses and the catalog loader.

The catalog (``topologies/catalog/*.yaml``) keeps every figure in its datasheet unit
(``nic_gbit_per_s``, ``hbm_tbyte_per_s``, ...) next to its ``source:``. This module
converts each figure once into SI units (bytes, bytes/s, FLOP/s, seconds, watts) so
that nothing downstream deals with bits versus bytes again.

The machine at hand (node ``localhost``) has no datasheet: its figures come from a
profile measured by ``trainplan calibrate`` (see ``load_profile``).
"""
from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

CATALOG_DIR = Path(__file__).parent / "catalog"
GIB = 1024**3
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")


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
    """Host link bandwidth per direction."""
    tdp_w: float
    source: str
    calibrated: bool = False
    efficiency_json: str = ""
    """A calibrated profile's efficiency entry (JSON text, so the GPU stays hashable);
    empty for catalog GPUs, whose entry lives in ``efficiency.yaml``."""

    def peak(self, precision: str) -> float | None:
        return dict(self.peak_flops).get(precision)


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Catalog:
    gpus: dict[str, GPU]
    nodes: dict[str, dict]
    """Raw node entries; resolve one with ``node(name)`` (localhost needs a profile)."""
    fabrics: dict[str, Fabric]
    storage: dict[str, Storage]
    prices: Prices
    models: dict[str, dict]
    """Raw model entries; ``simcore.plan.spec`` turns them into ModelSpec."""
    efficiency: dict[str, dict] = field(default_factory=dict)
    """Per-GPU efficiency curves (``efficiency.yaml``), used by the compute model."""

    def node(self, name: str, profile: str | os.PathLike | None = None) -> Node:
        if name not in self.nodes:
            raise CatalogError(f"unknown node '{name}' (known: {', '.join(sorted(self.nodes))})")
        raw = self.nodes[name]
        if raw.get("calibrated"):
            return load_profile(profile or default_profile_path(), raw, self)
        return _node(name, raw, self)


def _num(entry: dict, key: str, where: str, *, allow_none: bool = False) -> float | None:
    value = entry.get(key)
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CatalogError(f"{where}.{key} must be a number, got {value!r}")
    return float(value)


def _gpu(name: str, e: dict, calibrated: bool = False, efficiency: dict | None = None) -> GPU:
    where = f"gpus.{name}"
    tflops = e.get("dense_tflops") or {}
    peaks = tuple((p, None if tflops.get(p) is None else float(tflops[p]) * 1e12) for p in PRECISIONS)
    return GPU(
        name=name,
        description=str(e.get("description", name)),
        vendor=str(e.get("vendor", "")),
        peak_flops=peaks,
        hbm_bytes=_num(e, "hbm_gib", where) * GIB,
        hbm_bytes_per_s=_num(e, "hbm_tbyte_per_s", where) * 1e12,
        intra_link=str(e.get("intra_link", "pcie")),
        intra_link_bytes_per_s=_num(e, "intra_link_gbyte_per_s_bidir", where) * 1e9 / 2,
        pcie_gen=int(e.get("pcie_gen") or 0),
        pcie_bytes_per_s=_num(e, "pcie_gbyte_per_s_bidir", where) * 1e9 / 2,
        tdp_w=_num(e, "tdp_w", where),
        source=str(e.get("source", "")),
        calibrated=calibrated,
        efficiency_json=json.dumps(efficiency, sort_keys=True) if efficiency else "",
    )


def _node(name: str, e: dict, cat: Catalog, gpu: GPU | None = None) -> Node:
    where = f"nodes.{name}"
    if gpu is None:
        if e.get("gpu") not in cat.gpus:
            raise CatalogError(f"{where}.gpu '{e.get('gpu')}' is not in gpus.yaml")
        gpu = cat.gpus[e["gpu"]]
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
    )


def _fabric(name: str, e: dict) -> Fabric:
    where = f"fabrics.{name}"
    return Fabric(
        name=name,
        description=str(e.get("description", name)),
        nic_bytes_per_s=_num(e, "nic_gbit_per_s", where) * 1e9 / 8,
        latency_s=_num(e, "latency_us", where) * 1e-6,
        topology=str(e.get("topology", "fat-tree")),
        oversubscription=_num(e, "oversubscription", where),
        switch_radix=int(e.get("switch_radix") or 64),
        source=str(e.get("source", "")),
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
    )


def _read_yaml(path: Path) -> dict:
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise CatalogError(f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise CatalogError(f"{path} must hold a mapping at the top level")
    return data


@functools.lru_cache(maxsize=4)
def load_catalog(root: str | os.PathLike | None = None) -> Catalog:
    """Read every catalog file under ``root`` (default: the packaged catalog)."""
    root = Path(root) if root else CATALOG_DIR
    efficiency_path = root / "efficiency.yaml"
    cat = Catalog(
        gpus={n: _gpu(n, e) for n, e in _read_yaml(root / "gpus.yaml").items()},
        nodes=_read_yaml(root / "nodes.yaml"),
        fabrics={n: _fabric(n, e) for n, e in _read_yaml(root / "fabrics.yaml").items()},
        storage={n: _storage(n, e) for n, e in _read_yaml(root / "storage.yaml").items()},
        prices=_prices(_read_yaml(root / "prices.yaml")),
        models=_read_yaml(root / "models.yaml"),
        efficiency=_read_yaml(efficiency_path) if efficiency_path.exists() else {},
    )
    return cat


def default_profile_path() -> Path:
    """Where ``trainplan calibrate`` caches this host's profile."""
    env = os.environ.get("TRAINPLAN_PROFILE")
    if env:
        return Path(env)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "trainplan" / "localhost.yaml"


def load_profile(path: str | os.PathLike, raw_node: dict, cat: Catalog) -> Node:
    """A node whose device figures were measured on this machine.

    Without a profile the node still resolves (so a Plan can be checked and run),
    but its device figures are zero and ``calibrated`` is False: the simulator
    refuses to predict on it until ``trainplan calibrate`` has been run.
    """
    path = Path(path)
    if not path.exists():
        gpu = GPU(
            name="uncalibrated-host", description="this machine (not calibrated yet)", vendor="",
            peak_flops=tuple((p, None) for p in PRECISIONS), hbm_bytes=0.0, hbm_bytes_per_s=0.0,
            intra_link="shared-memory", intra_link_bytes_per_s=0.0, pcie_gen=0, pcie_bytes_per_s=0.0,
            tdp_w=0.0, source="none: run `trainplan calibrate`", calibrated=False,
        )
        entry = dict(raw_node, gpus_per_node=raw_node.get("gpus_per_node") or os.cpu_count() or 1)
        node = _node("localhost", entry, cat, gpu=gpu)
        return Node(**{**{f: getattr(node, f) for f in Node.__slots__}, "calibrated": False})
    prof = _read_yaml(path)
    if "device" not in prof:
        raise CatalogError(f"profile {path} has no 'device' section")
    efficiency = dict(prof.get("efficiency") or {})
    over = (prof.get("oversubscription") or {}).get("matmul_flops_per_s_per_rank")
    if over:
        efficiency["oversubscription"] = {str(k): v for k, v in over.items()}
    fits = (prof.get("collectives") or {}).get("all_reduce")
    if fits:
        efficiency["all_reduce_fits"] = {str(k): v for k, v in fits.items()}
    gpu = _gpu(str(prof["device"].get("name", "localhost-device")), prof["device"], calibrated=True,
               efficiency=efficiency)
    entry = {**raw_node, **(prof.get("node") or {})}
    entry.setdefault("gpus_per_node", os.cpu_count() or 1)
    if entry.get("gpus_per_node") is None:
        entry["gpus_per_node"] = os.cpu_count() or 1
    node = _node("localhost", entry, cat, gpu=gpu)
    return node


def scale_for_ranks(node: Node, ranks_per_node: int) -> Node:
    """A calibrated node as seen by ``ranks_per_node`` ranks running at once.

    On a CPU host the ranks share cores: the profile's oversubscription tables give the
    matmul throughput per rank (which scales the peak) and the eager tiny-layer rate per
    rank (which scales the host and kernel overheads: a rank given half a core issues its
    kernels half as fast) with 1, 2, 4 ... ranks running (``executors.calibrate.profile`` derives
    both from the one-rank rates and the slowdown of the executor's own step with n ranks,
    so peak and host overhead slow alike), and the collective fits give the
    all-reduce bus bandwidth and base latency per group size (the fit's ``base_latency_s``:
    its alpha less the ring's per-hop latencies, which collectives.py adds back), and the
    data-parallel sync wait table gives ``dp_sync_wait`` for that many ranks, and the
    torch-parallel host costs are those probed on the nearest rank count
    (``parallel_host_for_ranks``). Figures between the measured counts are interpolated in
    log2(ranks); beyond them the end values are used. Catalog nodes are returned unchanged.
    """
    if not node.gpu.efficiency_json:
        return node
    eff = json.loads(node.gpu.efficiency_json)
    table = {int(k): float(v) for k, v in (eff.get("oversubscription") or {}).items()}
    fits = {int(k): v for k, v in (eff.get("all_reduce_fits") or {}).items()}
    sync = {int(k): float(v) for k, v in (eff.get("dp_sync_wait_fraction") or {}).items()}
    if sync:   # a rank count's wait at the gradient sync (none for one rank)
        eff["dp_sync_wait"] = _interp_log2(sync, ranks_per_node) if ranks_per_node > 1 else 0.0
    if eff.get("parallel_host"):
        eff["parallel_host"] = parallel_host_for_ranks(eff["parallel_host"], ranks_per_node)
    gpu = node.gpu
    if table and 1 in table:
        factor = _interp_log2(table, ranks_per_node) / table[1]
        gpu = _replace(gpu, peak_flops=tuple((p, None if v is None else v * factor) for p, v in gpu.peak_flops))
    slow = host_slowdown(eff, ranks_per_node)
    if slow != 1.0:
        for key in ("host_overhead_us", "kernel_overhead_us", "dispatch_us"):
            if key in eff:
                eff[key] = float(eff[key]) * slow
    if fits:
        n = _nearest_log2(fits, ranks_per_node)
        base = fits[n].get("base_latency_s", fits[n]["alpha_s"])
        eff["collective"] = {**eff["collective"], "base_latency_us": base * 1e6}
        gpu = _replace(gpu, intra_link_bytes_per_s=fits[n]["bus_bytes_per_s"])
    gpu = _replace(gpu, efficiency_json=json.dumps(eff, sort_keys=True))
    return _replace(node, gpu=gpu)


def _nearest_log2(counts, n: int) -> int:
    """The count of ``counts`` nearest ``n`` in log2 (the larger on a tie)."""
    return min(counts, key=lambda k: (abs(math.log2(k) - math.log2(max(n, 1))), -k))


def parallel_host_for_ranks(ph: dict, ranks: int) -> dict:
    """The torch-parallel host costs of a CPU profile (``efficiency.parallel_host``) for
    ``ranks`` ranks at once: the calibration's parallel probe ran on ``probe_ranks`` ranks,
    and a grouped probe on n ranks kept its figures as ``name@n`` (its communication shares
    likewise in ``comm_share``); the figures of the count nearest ``ranks`` in log2 stand
    under the plain names, and the ``@n`` entries are dropped. (Those kernel counts are in
    the simulator's per-kernel time, which ``host_slowdown`` scales on from that count.)"""
    def split(d: dict) -> tuple[dict, dict]:
        plain = {k: v for k, v in d.items() if "@" not in k}
        at = {}
        for k, v in d.items():
            if "@" in k:
                name, n = k.rsplit("@", 1)
                if not n.isdigit() or int(n) < 1:
                    raise CatalogError(f"profile parallel_host.{k}: what follows '@' must be a rank count")
                at.setdefault(int(n), {})[name] = v
        return plain, at

    out, at = split(ph)
    shares, share_at = split(ph.get("comm_share") or {})
    if shares or share_at:
        out["comm_share"] = shares
    counts = set(at) | set(share_at)
    if not counts:
        return out
    n = _nearest_log2({int(ph.get("probe_ranks", 2)), *counts}, ranks)   # (profiles before probe_ranks: 2)
    out.update(at.get(n, {}))
    if n in share_at:
        out["comm_share"] = {**shares, **share_at[n]}
    return out


def host_slowdown(efficiency: dict, ranks: int) -> float:
    """The factor by which a calibrated CPU profile's per-kernel host times grow with ``ranks``
    ranks running at once: the one-rank layer rate over the per-rank rate with ``ranks``
    (``host_oversubscription``, interpolated in log2(ranks)); 1 without the table."""
    host = {int(k): float(v) for k, v in (efficiency.get("host_oversubscription") or {}).items()}
    return host[1] / _interp_log2(host, ranks) if 1 in host else 1.0


def _interp_log2(table: dict[int, float], n: int) -> float:
    keys = sorted(table)
    if n <= keys[0]:
        return table[keys[0]]
    if n >= keys[-1]:
        return table[keys[-1]]
    for k0, k1 in zip(keys, keys[1:]):
        if n <= k1:
            t = (math.log2(n) - math.log2(k0)) / (math.log2(k1) - math.log2(k0))
            return table[k0] + t * (table[k1] - table[k0])
    return table[keys[-1]]


def _replace(obj, **changes):
    import dataclasses

    return dataclasses.replace(obj, **changes)
