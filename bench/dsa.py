"""What DeepSeek Sparse Attention buys a DeepSeek-V3-shaped model as trainplan prices it
(``simcore/model/dsa.py``): the step of the same layout with and without the indexer, by sequence
length, on both engines. Up to ``topk`` keys the sparse kernel reads every key (twice a causal
flash kernel's half) and the indexer only adds; past it a query reads ``topk`` keys, not its whole
prefix. No measurement of DSA training is stored, so these are the model's figures only.

    .venv/bin/python bench/dsa.py [--layers N]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simcore.engine.predict import simulate  # noqa: E402
from simcore.plan.load import plan_from_dict  # noqa: E402

HF_V32 = Path(__file__).resolve().parents[1] / "examples" / "hf" / "deepseek-v3.2" / "config.json"
#: One layout for every length: 256 DGX H100, TP 2 with sequence parallelism, PP 8 (1F1B), EP 64, the
#: distributed optimizer, selective recompute; the global batch holds 16M tokens.
LAYOUT = {"tp": 2, "pp": 8, "dp": 128, "ep": 64, "zero": 1, "sequence_parallel": True, "schedule": "1f1b"}
TOKENS = 2 ** 24


def plan(seq: int, sparse: bool, layers: int):
    model = {"hf_config": str(HF_V32), "seq_len": seq, "mtp_layers": 0, "layers": layers}
    if not sparse:
        model["sparse_attention"] = None
    return plan_from_dict({"name": f"dsv32-{seq}", "model": model, "cluster": {"node": "dgx-h100", "nodes": 256},
                           "parallel": LAYOUT, "training": {"global_batch": TOKENS // seq, "micro_batch": 1,
                                                            "precision": "bf16", "recompute": "selective",
                                                            "flash_attention": True}})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=64, help="layers of the model (DeepSeek-V3.2: 61; a multiple of pp)")
    args = ap.parse_args()
    print(f"DeepSeek-V3.2 shape, {args.layers} layers, {LAYOUT}, {TOKENS:,} tokens a step (model figures, nothing measured)")
    print(f"{'seq':>7} {'dense s':>9} {'DSA s':>9} {'DSA/dense':>10} {'event engine DSA/dense':>23}")
    for seq in (2048, 4096, 16384, 65536):
        a = [simulate(plan(seq, s, args.layers)).step_time_s for s in (False, True)]
        d = [simulate(plan(seq, s, args.layers), engine="des").step_time_s for s in (False, True)]
        print(f"{seq:>7} {a[0]:>9.2f} {a[1]:>9.2f} {a[1] / a[0]:>10.3f} {d[1] / d[0]:>23.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
