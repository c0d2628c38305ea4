"""One decode layer's kernels on a GPU, alone and in sequence, against the serving cost model.

``simcore/serving/cost.py`` prices a serving iteration as the sum of its kernels' rooflines (each
GEMM the larger of its FLOPs and its weights' read, attention the larger of its FLOPs and its
KV read), not one roofline of the whole iteration. This bench checks that on the GPU at hand:
Llama 3 8B's decode layer (QKV, output, gate/up and down projections in bf16; attention of one
new token a request over its cached context, grouped-query, through torch's SDPA with the query
heads of a KV head as its query rows), captured in a CUDA graph as the engines run it, at
several batch sizes and contexts: each part alone, then the whole layer.

    python bench/gpu_serving_kernels.py measure OUT.json     # on the GPU (torch only)
    .venv/bin/python bench/gpu_serving_kernels.py compare OUT.json --node hgx-h200

The H200 measurement of 2026-11-28 is validation/gpu_serving_kernels_h200.json (bench/RESULTS.md).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

#: Llama 3 8B: hidden, query heads, KV heads, head width, MLP width (its config.json).
H, HEADS, KV_HEADS, HEAD_DIM, FFN = 4096, 32, 8, 128, 14336
BATCHES = (1, 32, 128, 256, 512)
CONTEXTS = (1024, 4096)


def _time_graph(fn, iters: int = 50) -> float:
    """Seconds per replay of ``fn`` captured in a CUDA graph."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters / 1e3


def measure(out: Path) -> None:
    import torch
    import torch.nn.functional as F

    dt, dev = torch.bfloat16, "cuda"
    w = {"qkv": torch.randn(H, (HEADS + 2 * KV_HEADS) * HEAD_DIM, dtype=dt, device=dev) * 0.02,
         "o": torch.randn(HEADS * HEAD_DIM, H, dtype=dt, device=dev) * 0.02,
         "gate_up": torch.randn(H, 2 * FFN, dtype=dt, device=dev) * 0.02,
         "down": torch.randn(FFN, H, dtype=dt, device=dev) * 0.02}
    rows = []
    for ctx in CONTEXTS:
        for b in BATCHES:
            x = torch.randn(b, H, dtype=dt, device=dev)
            z = torch.randn(b, FFN, dtype=dt, device=dev)
            q = torch.randn(b, KV_HEADS, HEADS // KV_HEADS, HEAD_DIM, dtype=dt, device=dev)
            k = torch.randn(b, KV_HEADS, ctx, HEAD_DIM, dtype=dt, device=dev)
            v = torch.randn(b, KV_HEADS, ctx, HEAD_DIM, dtype=dt, device=dev)
            parts = {name: (lambda a=(z if name == "down" else x), m=m: a @ m) for name, m in w.items()}
            parts["attention"] = lambda: F.scaled_dot_product_attention(q, k, v)

            def layer():
                for fn in parts.values():
                    fn()
            row = {"batch": b, "context": ctx, **{n: _time_graph(fn) for n, fn in parts.items()},
                   "layer": _time_graph(layer)}
            rows.append(row)
            print(row, flush=True)
            del k, v
            torch.cuda.empty_cache()
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
                              indent=1))


def predicted(b: int, ctx: int, gpu_node: str) -> dict:
    """The serving cost model's seconds of one layer's parts for Llama 3 8B in bf16 on ``gpu_node``
    (``simcore.serving.cost``: ``ReplicaCost.linear_s`` and ``attention_s``, a decode step of ``b``
    requests of ``ctx`` cached tokens each), and the one roofline it priced before 298eb27."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from simcore.serving.cost import replica_cost
    from simcore.serving.load import serving_from_dict

    rc = replica_cost(serving_from_dict({
        "model": "llama3-8b", "hardware": {"node": gpu_node}, "parallel": {"tp": 1},
        "precision": {"weights": "bf16", "activations": "bf16", "kv_cache": "bf16"},
        "traffic": {"arrival": "offline", "num_requests": 1, "prompt_len": 1, "output_len": 1}}))
    m, dev, n = rc.layers, rc.dev, b * ctx
    gemms, attention = rc.linear_s(b) / m, rc.attention_s(n, n + b) / m
    compute = sum(count * per * b / (dev.peak_flops * dev.matmul.at(per * b)) for per, count, *_ in rc.gemms)
    weights = sum(count * w for _, count, _, w, _ in rc.gemms)
    one = max(compute + n * rc.attn_flops_per_pair / m / (dev.peak_flops * dev.attention_forward),
              (weights + (n + b) * rc.kv_bytes_per_token / m) / (dev.hbm_bytes_per_s * dev.memory_efficiency))
    return {"gemms": gemms, "attention": attention, "layer (sum)": gemms + attention, "layer (one roofline)": one}


def compare(path: Path, node: str) -> None:
    doc = json.loads(path.read_text())
    print(f"{doc['device']} (torch {doc['torch']}) against the catalog's {node}; times in ms, measured / predicted")
    print(f"{'batch':>6} {'ctx':>5} {'GEMMs':>15} {'attention':>15} {'layer':>9} {'sum':>9} {'one roofline':>13}")
    for r in doc["rows"]:
        p = predicted(r["batch"], r["context"], node)
        gm, gp = sum(r[n] for n in ("qkv", "o", "gate_up", "down")) * 1e3, p["gemms"] * 1e3
        print(f"{r['batch']:>6} {r['context']:>5} {gm:>7.3f}/{gp:<7.3f} {r['attention'] * 1e3:>7.3f}/"
              f"{p['attention'] * 1e3:<7.3f} {r['layer'] * 1e3:>9.3f} {p['layer (sum)'] * 1e3:>9.3f} "
              f"{p['layer (one roofline)'] * 1e3:>13.3f}")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "measure":
        measure(Path(sys.argv[2]))
    elif len(sys.argv) >= 3 and sys.argv[1] == "compare":
        compare(Path(sys.argv[2]), sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--node" else "hgx-h200")
    else:
        print(__doc__)
        sys.exit(2)
