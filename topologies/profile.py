"""The calibrated localhost profile: where ``trainplan calibrate`` caches it
(``default_profile_path``), the node it describes (``load_profile``), a catalog node with a
cluster's fitted efficiency figures (``overlay_profile``), and the localhost node as
seen by n ranks sharing the host (``scale_for_ranks``, ``parallel_host_for_ranks``,
``host_slowdown``).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from topologies.components import GPU, PRECISIONS, CatalogError, Node, _gpu, _node, _read_yaml


def default_profile_path() -> Path:
    """Where ``trainplan calibrate`` caches this host's profile."""
    env = os.environ.get("TRAINPLAN_PROFILE")
    if env:
        return Path(env)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "trainplan" / "localhost.yaml"


def load_profile(path: str | os.PathLike, raw_node: dict, gpus: dict[str, GPU]) -> Node:
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
        node = _node("localhost", entry, gpus, gpu=gpu)
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
    node = _node("localhost", entry, gpus, gpu=gpu)
    return node


def overlay_profile(node: Node, path: str | os.PathLike) -> Node:
    """A catalog node whose GPU's efficiency entry is a fitted profile's (``cluster.profile``:
    ``trainplan calibrate --from-trace`` writes one for the GPU of a cluster's traced run, the
    catalog's entry with the figures its traces determine replaced). The datasheet figures, the
    node's links and NICs stay the catalog's; a profile of another GPU is refused."""
    path = Path(path)
    if not path.exists():
        raise CatalogError(f"profile {path} does not exist")
    prof = _read_yaml(path)
    eff = prof.get("efficiency") if isinstance(prof, dict) else None
    if not isinstance(eff, dict) or not isinstance(eff.get("collective"), dict):
        raise CatalogError(f"profile {path} has no 'efficiency' section of a GPU's shape "
                           "(write one with trainplan calibrate --from-trace)")
    name = str((prof.get("device") or {}).get("name", "")) if isinstance(prof.get("device"), dict) else ""
    if name != node.gpu.name:
        raise CatalogError(f"profile {path} is of GPU {name or '(unnamed)'}, not of the node's {node.gpu.name}")
    gpu = _replace(node.gpu, efficiency_json=json.dumps(eff, sort_keys=True),
                   source=f"{node.gpu.source}; efficiency figures: profile {path}")
    return _replace(node, gpu=gpu)


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
