"""A real browser opens each kind of report: every figure loads, nothing is fetched from outside.

Headless Chromium (Debian's ``chromium``; ``make test`` installs it where apt can) loads a
harness page that frames the report and reports, once loaded, how many images it has and
how many failed to decode. Without Chromium the test is skipped and says why.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import pandas as pd
import pytest

from reports.build import validate_report
from reports.compare import compare
from reports.render import render
from trainplan.validate import MatrixResult, summary_row
from tests.reports.test_reports import result

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--allow-file-access-from-files", "--virtual-time-budget=8000"]

HARNESS = """<!doctype html><html><body><pre id=out>pending</pre>
<iframe id=f src="index.html" width=1200 height=900></iframe>
<script>
document.getElementById('f').onload = function () {
  var d = this.contentDocument, imgs = d.images, broken = 0;
  for (var i = 0; i < imgs.length; i++) { if (!imgs[i].complete || imgs[i].naturalWidth === 0) broken++; }
  document.getElementById('out').textContent =
    'images=' + imgs.length + ' broken=' + broken + ' h2=' + d.querySelectorAll('h2').length +
    ' overflow=' + Math.max(0, d.documentElement.scrollWidth - d.documentElement.clientWidth);
};
</script></body></html>"""


def browser_check(report_dir, user_dir) -> dict[str, int]:
    (report_dir / "harness.html").write_text(HARNESS)
    proc = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={user_dir}", "--dump-dom",
                           f"file://{report_dir / 'harness.html'}"], capture_output=True, text=True, timeout=600)
    found = re.search(r"images=(\d+) broken=(\d+) h2=(\d+) overflow=(\d+)", proc.stdout)
    assert found, f"the harness did not report (chromium said: {proc.stderr[-400:]})"
    return dict(zip(("images", "broken", "h2", "overflow"), map(int, found.groups())))


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (make test installs Debian's chromium)")
def test_validate_report_in_chromium(tmp_path):
    comps = (compare(result("des", 1.1, 2.0), result("measured", 1.0, 2.0)),
             compare(result("des", 0.4, 1.0), result("measured", 0.5, 1.0)))
    res = MatrixResult(table=pd.DataFrame([summary_row(n, c) for n, c in zip("ab", comps)]),
                       comparisons=comps, failures=())
    render(validate_report(res), tmp_path / "report")
    seen = browser_check(tmp_path / "report", tmp_path / "chromium")
    assert seen["images"] == 1 and seen["broken"] == 0 and seen["h2"] >= 2


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (make test installs Debian's chromium)")
def test_the_harness_sees_a_broken_image(tmp_path):
    page = tmp_path / "report"
    page.mkdir()
    (page / "index.html").write_text("<html><body><h2>x</h2><img src='data:image/png;base64,AAAA'></body></html>")
    assert browser_check(page, tmp_path / "chromium") == {"images": 1, "broken": 1, "h2": 1, "overflow": 0}
    (page / "index.html").write_text("<html><body><h2>x</h2><table><tr><td>" + "wide " * 2000 + "</td></tr>"
                                     "</table><div style='width:5000px'>x</div></body></html>")
    assert browser_check(page, tmp_path / "chromium")["overflow"] > 0


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (make test installs Debian's chromium)")
def test_whatif_report_in_chromium(tmp_path):
    from reports.build import whatif_report
    from simcore.planner.whatif import run_whatif, sweep_from_dict

    sweep = sweep_from_dict({"name": "t", "model": "gpt-1.7b", "cluster": {"node": "dgx-h100", "nodes": 1},
                             "global_batch": 64, "tokens": 1e10, "grid": {"gpu": ["a100-80gb", "h200"], "nodes": [1, 2]},
                             "space": {"tp": [1], "pp": [1], "cp": [1], "zero": [1], "micro_batch": [2]},
                             "failures": False})
    render(whatif_report(run_whatif(sweep, progress=False)), tmp_path / "report")
    seen = browser_check(tmp_path / "report", tmp_path / "chromium")
    assert seen["images"] == 3 and seen["broken"] == 0 and seen["h2"] >= 4  # 3 figures + the cell table
    assert seen["overflow"] == 0                                             # nothing runs off to the right


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (make test installs Debian's chromium)")
def test_plan_report_in_chromium_does_not_overflow(tmp_path):
    from reports.build import plan_report
    from simcore.engine.predict import simulate
    from simcore.model.step_costs import memory_report
    from simcore.planner.runcost import run_cost
    from simcore.planner.search import search

    res = search({"name": "gpt-1.7b"}, {"node": "dgx-h100", "nodes": 1}, 32, top_k=2, tokens=1e10, progress=False)
    pred = simulate(res.best, engine="des")
    render(plan_report(res, run_cost(res.best, pred, 1e10, monte_carlo=0), pred, memory_report(res.best),
                       tokens=1e10), tmp_path / "report")
    seen = browser_check(tmp_path / "report", tmp_path / "chromium")
    assert seen["broken"] == 0 and seen["overflow"] == 0


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (make test installs Debian's chromium)")
def test_trace_compare_report_in_chromium(tmp_path, capsys):
    """`compare PLAN --trace DIR --out` on the real DDP trace (tests/runlogs/fixtures/kineto): its
    page shows its figures and its phase table without running off to the right."""
    from tests.runlogs.test_kineto_cli import KINETO, PLAN
    from trainplan.cli import main

    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    out = tmp_path / "report"
    assert main(["compare", str(plan), "--trace", str(KINETO / "hta_nccl_ddp"), "--out", str(out)]) == 0
    capsys.readouterr()
    seen = browser_check(out, tmp_path / "chromium")
    assert seen == {"images": 2, "broken": 0, "h2": 6, "overflow": 0}   # measured and predicted step figures
