"""serve --trace and --plot: the iterations as a Chrome trace that adds up to the run, and one
figure of the KV cache, the decoding requests and the latency distributions."""
from __future__ import annotations

import json

from reports.serving_plots import serving_chrome_trace
from simcore.engine.serving import ServingTimeline, simulate_serving
from simcore.serving.load import serving_from_dict
from trainplan.cli import main

DOC = {"model": "llama3-8b", "hardware": {"node": "dgx-h100"}, "parallel": {"tp": 1, "replicas": 2},
       "router": "least_outstanding",
       "traffic": {"arrival": "poisson", "rate": 30, "num_requests": 300, "prompt_len": 1024, "output_len": 64}}


def test_the_trace_adds_up_to_the_run():
    timeline = ServingTimeline()
    r = simulate_serving(serving_from_dict(DOC), timeline=timeline)
    doc, left_out = serving_chrome_trace(timeline, "x")
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert left_out == 0 and len(slices) == r.iterations
    assert {e["pid"] for e in slices} == {0, 1}
    for rep in (0, 1):
        mine = sorted((e for e in slices if e["pid"] == rep), key=lambda e: e["ts"])
        # one iteration after another on a replica, never overlapping, all within the run
        assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-6 for a, b in zip(mine, mine[1:]))
        assert mine[-1]["ts"] + mine[-1]["dur"] <= timeline.finish.max() * 1e6 * (1 + 1e-9)
        assert mine[0]["ts"] >= timeline.arrivals.min() * 1e6
    prefill = sum(e["args"]["prefill_tokens"] for e in slices)
    assert r.preemptions == 0 and prefill == 300 * 1024   # every prompt prefilled once
    kv = max(e["args"]["in use"] for e in doc["traceEvents"] if e["ph"] == "C" and e["name"] == "KV blocks")
    assert kv / timeline.kv_blocks == r.kv_occupancy_max
    short, left = serving_chrome_trace(timeline, "x", max_iterations=10)
    assert left == r.iterations - 10 and sum(e["ph"] == "X" for e in short["traceEvents"]) == 10


def test_serve_writes_the_trace_and_the_figure(tmp_path, capsys):
    f = tmp_path / "serve.yaml"
    f.write_text(json.dumps(DOC))
    trace, png = tmp_path / "t.json", tmp_path / "serve.png"
    assert main(["serve", str(f), "--trace", str(trace), "--plot", str(png)]) == 0
    assert json.loads(trace.read_text())["traceEvents"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    err = capsys.readouterr().err
    assert f"wrote {trace}" in err and f"wrote {png}" in err
