"""The hardware catalog: ``load_catalog`` reads ``topologies/catalog/*.yaml`` into a
``Catalog`` of the dataclasses in ``topologies.components``, which converts each figure
once from its datasheet unit into SI units.

The machine at hand (node ``localhost``) has no datasheet: its figures come from a
profile measured by ``trainplan calibrate`` (see ``topologies.profile.load_profile``).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

from topologies.components import (
    GPU, CatalogError, Fabric, Node, Prices, Storage, _fabric, _gpu, _node,
    _prices, _read_yaml, _storage,
)
from topologies.profile import default_profile_path, load_profile, overlay_profile

CATALOG_DIR = Path(__file__).parent / "catalog"


@dataclass(frozen=True, slots=True, kw_only=True)
class Catalog:
    gpus: dict[str, GPU]
    nodes: dict[str, dict]
    """Raw node entries; resolve one with ``node(name)`` (localhost needs a profile)."""
    fabrics: dict[str, Fabric]
    storage: dict[str, Storage]
    prices: Prices
    models: dict[str, dict]
    """Raw model entries; ``simcore.plan.load`` turns them into ModelSpec."""
    efficiency: dict[str, dict] = field(default_factory=dict)
    """Per-GPU efficiency curves (``efficiency.yaml``), used by the compute model."""

    def node(self, name: str, profile: str | os.PathLike | None = None) -> Node:
        if name not in self.nodes:
            raise CatalogError(f"unknown node '{name}' (known: {', '.join(sorted(self.nodes))})")
        raw = self.nodes[name]
        if raw.get("calibrated"):
            return load_profile(profile or default_profile_path(), raw, self.gpus)
        node = _node(name, raw, self.gpus)
        return overlay_profile(node, profile) if profile else node


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
