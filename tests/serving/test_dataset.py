"""Request lengths from a dataset file: read in the forms benchmarks write (JSON Lines of
lengths, trtllm-bench's input_ids/output_tokens, CSV), drawn per request with the seed; one pair
is the fixed lengths exactly; output throughput counts each request's own output."""
from __future__ import annotations

import json

import numpy as np
import pytest

from simcore.engine.serving import arrival_times, request_lengths, simulate_serving
from simcore.serving.dataset import read_lengths
from simcore.serving.load import serving_from_dict
from simcore.serving.spec import PlanError
from trainplan.cli import main


def plan(tmp_path, traffic: dict, **extra):
    """A serving plan with this traffic (a key given None is left out)."""
    t = {k: v for k, v in {"arrival": "poisson", "rate": 6, "num_requests": 300, **traffic}.items() if v is not None}
    return serving_from_dict({"model": "llama3-8b", "hardware": {"node": "dgx-h100"}, "parallel": {"tp": 1},
                              "traffic": t, **extra}, base_dir=tmp_path)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_three_forms_read_alike(tmp_path):
    pairs = [(812, 154), (40, 1), (2048, 512)]
    a = write_jsonl(tmp_path / "a.jsonl", [{"prompt_len": p, "output_len": o} for p, o in pairs])
    b = write_jsonl(tmp_path / "b.jsonl", [{"task_id": i, "input_ids": list(range(p)), "output_tokens": o}
                                           for i, (p, o) in enumerate(pairs)])
    c = tmp_path / "c.csv"
    c.write_text("prompt_len,output_len\n" + "".join(f"{p},{o}\n" for p, o in pairs))
    assert read_lengths(a) == read_lengths(b) == read_lengths(c) == tuple(pairs)


@pytest.mark.parametrize("text, words", [
    ('{"prompt_len": 10}\n', "line 1: needs prompt_len and output_len"),
    ('{"prompt_len": 10, "output_len": 0}\n', "line 1: output_len=0 must be a whole number of tokens, at least 1"),
    ('{"prompt_len": 10, "output_len": 5}\nnot json\n', "line 2: not JSON"),
    ("", "holds no request"),
])
def test_a_bad_line_is_one_sentence(tmp_path, text, words):
    f = tmp_path / "bad.jsonl"
    f.write_text(text)
    with pytest.raises(PlanError, match=words):
        read_lengths(f)


def test_one_pair_is_the_fixed_lengths(tmp_path):
    write_jsonl(tmp_path / "one.jsonl", [{"prompt_len": 700, "output_len": 90}])
    fixed = simulate_serving(plan(tmp_path, {"prompt_len": 700, "output_len": 90}))
    drawn = simulate_serving(plan(tmp_path, {"dataset": "one.jsonl"}))
    assert repr(drawn) == repr(fixed)      # field by field (the SLO figures are NaN without an SLO)


def test_each_request_draws_its_lengths_and_throughput_counts_them(tmp_path):
    rows = [{"prompt_len": p, "output_len": o} for p, o in ((64, 8), (4096, 512), (512, 64), (1024, 1))]
    write_jsonl(tmp_path / "mix.jsonl", rows)
    p = plan(tmp_path, {"dataset": "mix.jsonl"})
    assert (p.traffic.prompt_len, p.traffic.output_len, p.traffic.max_total) == (1424, 146, 4608)
    prompt, output = request_lengths(p)
    assert set(zip(prompt.tolist(), output.tolist())) == {(r["prompt_len"], r["output_len"]) for r in rows}
    assert np.array_equal(request_lengths(p)[0], prompt)            # seeded
    r = simulate_serving(p)
    assert r.output_tok_s * r.makespan_s == pytest.approx(output.sum(), rel=1e-9)
    assert r.total_tok_s * r.makespan_s == pytest.approx((prompt + output).sum(), rel=1e-9)


def test_lengths_and_a_dataset_together_are_refused(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", [{"prompt_len": 10, "output_len": 10}])
    with pytest.raises(PlanError, match="prompt_len and output_len, or a dataset file of both, not both"):
        plan(tmp_path, {"dataset": "d.jsonl", "prompt_len": 10})


def test_serve_says_where_the_lengths_come_from(tmp_path, capsys):
    write_jsonl(tmp_path / "d.jsonl", [{"prompt_len": 300, "output_len": 40}, {"prompt_len": 900, "output_len": 120}])
    f = tmp_path / "serve.yaml"
    f.write_text(json.dumps({"model": "llama3-8b", "hardware": {"node": "dgx-h100"},
                             "traffic": {"arrival": "poisson", "rate": 4, "num_requests": 80, "dataset": "d.jsonl"}}))
    assert main(["serve", str(f)]) == 0
    assert "lengths drawn from d.jsonl (2 requests; mean prompt 600, mean output 80, longest 1020 tokens)" \
        in capsys.readouterr().out


AZURE = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"      # the first lines of AzureLLMInferenceTrace_conv.csv
         "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"
         "2023-11-16 18:15:51.2224670,879,55\n2023-11-16 18:15:51.3910170,91,16\n")


def test_an_azure_trace_replays_its_requests_at_their_times(tmp_path):
    (tmp_path / "azure.csv").write_text(AZURE)
    p = plan(tmp_path, {"arrival": "trace", "dataset": "azure.csv", "num_requests": None, "rate": None})
    assert p.traffic.num_requests == 4
    assert np.allclose(arrival_times(p), [0.0, 4.314579, 4.541877, 4.710427])
    prompt, output = request_lengths(p)
    assert prompt.tolist() == [374, 396, 879, 91] and output.tolist() == [44, 109, 55, 16]
    fast = plan(tmp_path, {"arrival": "trace", "dataset": "azure.csv", "num_requests": None,
                           "rate": 2 * p.traffic.trace_rate})
    assert np.allclose(arrival_times(fast), arrival_times(p) / 2)
    r = simulate_serving(p)
    assert r.requests == 4 and r.output_tok_s * r.makespan_s == pytest.approx(44 + 109 + 55 + 16)


def test_a_trace_needs_its_times_and_enough_requests(tmp_path):
    write_jsonl(tmp_path / "untimed.jsonl", [{"prompt_len": 10, "output_len": 10}])
    with pytest.raises(PlanError, match="traffic.arrival=trace needs traffic.dataset with each request's arrival"):
        plan(tmp_path, {"arrival": "trace", "dataset": "untimed.jsonl", "num_requests": 1})
    (tmp_path / "azure.csv").write_text(AZURE)
    with pytest.raises(PlanError, match="traffic.num_requests=9 exceeds the trace's 4 requests"):
        plan(tmp_path, {"arrival": "trace", "dataset": "azure.csv", "num_requests": 9})


def test_the_capacity_search_keeps_the_dataset(tmp_path):
    """at_rate rebuilt the traffic from the mean lengths and lost the dataset."""
    from simcore.planner.serving_search import at_rate

    write_jsonl(tmp_path / "mix.jsonl", [{"prompt_len": 64, "output_len": 8}, {"prompt_len": 4096, "output_len": 512}])
    p = plan(tmp_path, {"dataset": "mix.jsonl"})
    q = at_rate(p, 12.0)
    assert q.traffic.dataset == p.traffic.dataset and q.traffic.rate == 12.0
