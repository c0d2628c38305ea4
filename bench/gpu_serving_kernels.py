"""One decode layer's kernels on a GPU, alone and in sequence, against the serving cost model.

``simcore/serving/cost.py`` prices a serving iteration as the sum of its kernels' rooflines (each
GEMM the larger of its FLOPs and its weights' read, attention the larger of its FLOPs and its
KV read), not one roofline of the whole iteration. This bench checks that on the GPU at hand:
Llama 3 8B's decode layer (QKV, output, gate/up and down projections in bf16; attention of one
new token a request over its cached context, grouped-query, through torch's SDPA with the query
heads of a KV head as its query rows), captured in a CUDA graph as the engines run it, at
several batch sizes and contexts: each part alone, then the whole layer.

    python bench/gpu_serving_kernels.py measure OUT.json     # on the GPU (torch only)
    .venv/bin/python bench/gpu_serving_kernels.py compare OUT.json --gpu h200

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


def predicted(b: int, ctx: int, gpu: str) -> dict:
    """The cost model's seconds of each part (``simcore.serving.cost``'s per-kernel rooflines)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from simcore.model.compute import device_model
    from topologies.hardware import load_catalog

    cat = load_catalog()
    dev = device_model(cat.gpus[gpu], "bf16")
    bw = dev.hbm_bytes_per_s * dev.memory_efficiency
    shapes = {"qkv": (H, (HEADS + 2 * KV_HEADS) * HEAD_DIM), "o": (HEADS * HEAD_DIM, H), "gate_up": (H, 2 * FFN),
              "down": (FFN, H)}
    out, compute, weights = {}, 0.0, 0.0
    for name, (k, n) in shapes.items():
        flops = 2.0 * b * k * n
        c = flops / (dev.peak_flops * dev.matmul.at(flops))
        out[name] = max(c, 2.0 * k * n / bw)
        compute, weights = compute + c, weights + 2.0 * k * n
    attn_flops = 4.0 * b * ctx * HEADS * HEAD_DIM
    kv_bytes = 2.0 * b * ctx * KV_HEADS * HEAD_DIM * 2
    attn_c = attn_flops / (dev.peak_flops * dev.attention_forward)
    out["attention"] = max(attn_c, kv_bytes / bw)
    out["layer (sum)"] = sum(out.values())
    out["layer (one roofline)"] = max(compute + attn_c, (weights + kv_bytes) / bw)   # before 298eb27
    return out


def compare(path: Path, gpu: str) -> None:
    doc = json.loads(path.read_text())
    print(f"{doc['device']} (torch {doc['torch']}) against the catalog's {gpu}; times in ms, measured / predicted")
    print(f"{'batch':>6} {'ctx':>5} {'GEMMs':>15} {'attention':>15} {'layer':>9} {'sum':>9} {'one roofline':>13}")
    for r in doc["rows"]:
        p = predicted(r["batch"], r["context"], gpu)
        gm = sum(r[n] for n in ("qkv", "o", "gate_up", "down")) * 1e3
        gp = sum(p[n] for n in ("qkv", "o", "gate_up", "down")) * 1e3
        print(f"{r['batch']:>6} {r['context']:>5} {gm:>7.3f}/{gp:<7.3f} {r['attention'] * 1e3:>7.3f}/"
              f"{p['attention'] * 1e3:<7.3f} {r['layer'] * 1e3:>9.3f} {p['layer (sum)'] * 1e3:>9.3f} "
              f"{p['layer (one roofline)'] * 1e3:>13.3f}")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "measure":
        measure(Path(sys.argv[2]))
    elif len(sys.argv) >= 3 and sys.argv[1] == "compare":
        compare(Path(sys.argv[2]), sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--gpu" else "h200")
    else:
        print(__doc__)
        sys.exit(2)
