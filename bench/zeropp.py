"""What the model says ZeRO++ buys, set beside what DeepSpeed measured (nothing fitted).

DeepSpeed's ZeRO++ blog (deepspeedai/DeepSpeed @edaa7221, blogs/zeropp/chinese/README.md, the
text of the Microsoft Research blog "DeepSpeed ZeRO++: A leap in speed for LLM and chat model
training with 4X less communication", 2023) measured on 384 V100 GPUs with 4 InfiniBand links of
100 Gbps a node: ZeRO++ over ZeRO-3 +28% to +36% throughput at 1k tokens a GPU, +24% to +29% at
2k (its Figure 6, several model sizes); and (Figure 8) ZeRO++ with 200 Gbps between nodes about
as fast as ZeRO-3 with 800 Gbps for the 18B and 138B models.

The question here, with what the stored sources leave open stated as assumptions:
- the 18B GPT of DeepSpeed's ZeRO++ tutorial (docs/_tutorials/zeropp.md: 40 layers, hidden 6144,
  32 heads, sequence 512, fp16, activation checkpointing), GPT-2's vocabulary;
- 1k / 2k tokens a GPU = 2 / 4 sequences of 512, no accumulation;
- the nodes are the tutorial's "16x V100-SXM3" servers, the catalog's DGX-2 (``dgx2-v100-32gb``),
  24 of them, with the blog's network a node: 400 Gbps is 4 of its 100 Gbps NICs
  (``cluster.nics_per_node``), 200 Gbps 2 and 800 Gbps all 8; hpZ over the 16 GPUs of a node.
  (Until 2026-11-28 this bench ran 48 8-GPU DGX-1 with the same bandwidth a GPU: a ring's
  inter-node traffic is the whole buffer per node boundary whatever the GPUs a node, so that
  halved ZeRO-3's bandwidth and put the gain at 1.89x against the blog's 1.28-1.36x.)
- all three switches on (the blog's ZeRO++).

    .venv/bin/python bench/zeropp.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simcore.engine.predict import simulate  # noqa: E402
from simcore.plan.load import plan_from_dict  # noqa: E402

NODE, GPUS_PER_NODE = "dgx2-v100-32gb", 16
ZEROPP = {"zero_quantized_weights": True, "zero_hpz_partition_size": GPUS_PER_NODE, "zero_quantized_gradients": True}
MODEL = {"name": "gpt-18b-zeropp-tutorial", "layers": 40, "hidden": 6144, "heads": 32, "vocab": 50304,
         "seq_len": 512, "position_embedding": "learned", "tied_embeddings": True}


def plan(nics: int, micro_batch: int, zeropp: bool):
    return plan_from_dict({
        "model": MODEL, "cluster": {"node": NODE, "nodes": 384 // GPUS_PER_NODE, "nics_per_node": nics},
        "parallel": {"dp": 384, "zero": 3, "zero_impl": "deepspeed", **(ZEROPP if zeropp else {})},
        "training": {"global_batch": 384 * micro_batch, "micro_batch": micro_batch, "precision": "fp16",
                     "recompute": "full"}})


def main() -> int:
    print("ZeRO++ over ZeRO-3, 384 V100 on 24 DGX-2, 400 Gbps a node, analytic and event engine:")
    for mb, measured in ((2, "1.28-1.36"), (4, "1.24-1.29")):
        gains = []
        for engine in ("analytic", "des"):
            base, zpp = (simulate(plan(4, mb, z), engine=engine).step_time_s for z in (False, True))
            gains.append(f"{engine} {base:.2f} s -> {zpp:.2f} s, {base / zpp:.2f}x")
        print(f"  {mb * 512} tokens a GPU: {'; '.join(gains)}   (DeepSpeed measured {measured}x over model sizes)")
    print("ZeRO++ at 200 Gbps against ZeRO-3 at 800 Gbps a 16-GPU node (DeepSpeed: about as fast, 18B and 138B):")
    for mb in (2, 4):
        slow, fast = simulate(plan(2, mb, True)).step_time_s, simulate(plan(8, mb, False)).step_time_s
        bare = simulate(plan(2, mb, False)).step_time_s
        print(f"  {mb * 512} tokens a GPU: ZeRO++ {slow:.2f} s, ZeRO-3 {fast:.2f} s ({fast / slow:.2f}x its speed; "
              f"ZeRO-3 at 200 Gbps {bare:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
