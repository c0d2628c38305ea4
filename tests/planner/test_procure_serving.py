"""procure's serving question: with a serving section, the cheapest GPU kind, TP x replicas and
precision meeting the SLO at the rate, answered beside the training answer, in the report and
the JSON; a bad serving field is one sentence."""
from __future__ import annotations

import json

import pytest

from simcore.plan.spec import PlanError
from simcore.planner.procure import run_procure
from simcore.planner.procure_input import candidates_from_dict
from simcore.planner.serving_search import capacity_search
from simcore.planner.procure_serving import serving_plan
from trainplan.cli import main

SERVING = {"rate": 8, "prompt_len": 512, "output_len": 64, "ttft_ms": 500, "tpot_ms": 40, "tp": [1, 2],
           "precisions": ["bf16"], "num_requests": 200}
DOC = {"model": {"name": "llama3-8b", "seq_len": 4096}, "tokens": 1e10, "global_batch": 64,
       "gpus": ["h100-sxm", "a100-80gb"], "nodes": [2], "modes": ["reserved", "buy"], "resimulate": False,
       "serving": SERVING}


def test_the_serving_answer_is_the_capacity_searchs_cheapest():
    c = candidates_from_dict(DOC)
    res = run_procure(c, progress=False).serving
    assert res.mode == "reserved"          # the candidates' first way of paying that serving prices
    best = res.best
    assert best is not None and best.met and best.result.slo_met
    # the same question asked of the capacity search directly gives the same ranking
    plan = serving_plan(c.model, SERVING, "dgx-h100")
    direct = capacity_search(plan, slo=plan.slo, rate=8, gpus=["h100-sxm", "a100-80gb"], precisions=["bf16"],
                             tps=[1, 2], mode="reserved")
    assert [(o.gpu, o.tp, o.replicas) for o in direct.options] == [(o.gpu, o.tp, o.replicas) for o in res.options]
    met = [o for o in res.options if o.met]
    assert [o.usd_per_mtok["reserved"] for o in met] == sorted(o.usd_per_mtok["reserved"] for o in met)


@pytest.mark.parametrize("edit, words", [
    ({"rate": None}, "candidates.serving needs 'rate'"),
    ({"ttft_ms": None, "tpot_ms": None}, "needs a latency target"),
    ({"precisions": ["int3"]}, "'int3' is not one of: bf16, fp8"),
    ({"rate": -1}, "candidates.serving.rate=-1 must be a positive number"),
    ({"prompt_len": 1.5}, "candidates.serving.prompt_len=1.5 must be a positive whole number"),
    ({"qps": 3}, "unknown candidates.serving field 'qps'"),
])
def test_a_bad_serving_field_is_one_sentence(edit, words):
    serving = {k: v for k, v in {**SERVING, **edit}.items() if v is not None}
    with pytest.raises(PlanError, match=words):
        candidates_from_dict({**DOC, "serving": serving})


def test_procure_prints_and_reports_the_serving_answer(tmp_path, capsys):
    f = tmp_path / "procure.json"
    f.write_text(json.dumps(DOC))
    assert main(["procure", str(f), "--report", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "serving (cheapest first, ranked by reserved)" in out
    assert "answer: Serving it at 8 req/s" in out and "per million output tokens" in out
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Serving it" in md and "serving it" in md
    assert main(["procure", str(f), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["serving"]["options"][0]["met"] and doc["serving"]["answer"].startswith("Serving it at 8 req/s")
