"""The command line: one sentence and exit code 2 for bad input; never a traceback."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from trainplan.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_check_prints_resolved_plan(capsys):
    assert main(["check", str(ROOT / "plans/gpt3-175b-a100.yaml")]) == 0
    out = capsys.readouterr().out
    assert "valid" in out and "tp: 8" in out and "micro_batches_per_step: 96" in out


def test_check_json(capsys):
    assert main(["check", str(ROOT / "plans/gpt3-175b-a100.yaml"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["derived"]["gpus_used"] == 1536


def test_bad_plan_is_one_sentence_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: gpt3-175b\ncluster: {node: dgx-a100-80gb, nodes: 1}\n"
                   "parallel: {tp: 7}\ntraining: {global_batch: 8}\n")
    assert main(["check", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "trainplan: error: parallel.tp=7 does not divide model.heads=96"


def test_missing_file_exit_2(capsys):
    assert main(["check", "/nonexistent/plan.yaml"]) == 2
    assert "cannot be read" in capsys.readouterr().err


def test_catalog_lists_every_kind_with_sources(capsys):
    assert main(["catalog", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"gpus", "nodes", "fabrics", "storage", "prices", "models"}
    assert all(row["source"] for row in data["gpus"])
    gpus = {row["gpu"]: row for row in data["gpus"]}
    assert {"b300", "gb200", "gb300", "mi325x", "mi355x"} <= set(gpus)
    assert gpus["gb200"]["nvfp4_tflops"] == 10000 and math.isnan(gpus["h100-sxm"]["nvfp4_tflops"])   # none on Hopper
    nodes = {row["node"]: row for row in data["nodes"]}
    assert nodes["gb200-nvl72"]["nvlink_domain_gpus"] == 72 and "https://" in nodes["gb200-nvl72"]["source"]


def test_console_script_has_no_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [\n")
    proc = subprocess.run([sys.executable, "-m", "trainplan.cli", "check", str(bad)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


def _tp_plan(tmp_path, **parallel):
    import yaml
    doc = {"model": {"name": "small", "layers": 2, "hidden": 512, "heads": 8, "kv_heads": 4, "ffn_hidden": 1408,
                     "vocab": 8000, "seq_len": 512, "gated_mlp": True, "tied_embeddings": False,
                     "position_embedding": "rope"},
           "cluster": {"node": "dgx-h100", "nodes": 1},
           "parallel": {"dp": 1, "tp": 2, "zero": 0, "sequence_parallel": True, **parallel},
           "training": {"global_batch": 2, "micro_batch": 1, "flash_attention": True, "recompute": "op"}}
    path = tmp_path / "tp.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_memory_torch_traces_tensor_parallel_and_refuses_pipelines_in_one_sentence(tmp_path, capsys):
    assert main(["memory", _tp_plan(tmp_path), "--torch"]) == 0
    out = capsys.readouterr().out
    assert "torch's MemTracker on the executor's model" in out and "loss_parallel" in out
    assert main(["memory", _tp_plan(tmp_path, pp=2), "--torch"]) == 2
    err = capsys.readouterr().err
    assert "parallel.pp=2" in err and "Traceback" not in err


def test_help_says_what_each_command_answers_with_an_example(capsys):
    """Issue 57.10: `trainplan --help` and each command's help are enough to start without the
    README: the question each answers and one example, which the parser takes."""
    import shlex

    import pytest

    from trainplan.cli import build_parser
    from trainplan.help_text import COMMANDS

    parser = build_parser()
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    assert "Start here:" in top and "trainplan check plans/llama3-70b-h100.yaml" in top
    commands = parser._subparsers._group_actions[0].choices
    assert set(commands) == set(COMMANDS)
    for name, (answers, example) in COMMANDS.items():
        with pytest.raises(SystemExit):
            main([name, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert " ".join(answers.split()) in text and f"example: {example}" in text, name
        argv = shlex.split(example.split(" > ")[0])
        assert argv[0] == "trainplan" and argv[1] == name
        parser.parse_args(argv[1:])   # the example is a command line the parser takes


def _rows(out: str) -> dict[tuple[str, str], int]:
    """(axis, kind) -> bytes per step of the first stage's table."""
    rows = {}
    for line in out.split("rank ")[1].splitlines()[2:]:
        axis, kind, _, *_, total = line.split()
        rows[axis, kind] = int(total.replace(",", ""))
    return rows


def test_collectives_list_the_plans_own_bytes(tmp_path, capsys):
    """Issue 57.10: `collectives` listed a bf16 plan's parameter traffic at fp32's 4 bytes. Its
    16-bit parameters are broadcast at 2 bytes, its gradients reduced in fp32 (Megatron-LM's
    default); ``--wire executor`` gives what trainplan's executor (autocast) moves."""
    import yaml

    plan = str(ROOT / "plans/llama3-70b-h100.yaml")
    assert main(["collectives", plan]) == 0
    out = capsys.readouterr().out
    note = out.strip().splitlines()[-1]
    assert "bytes in the plan's dtypes: parameters gathered or broadcast at 2 bytes" in note
    assert "gradients reduced at 4 bytes" in note
    assert main(["collectives", plan, "--wire", "executor"]) == 0
    exe = capsys.readouterr().out
    assert "autocast over fp32 parameters, so parameters gathered or broadcast at 4 bytes" in exe
    own, fp32 = _rows(out), _rows(exe)
    assert own["dp", "broadcast"] * 2 == fp32["dp", "broadcast"]       # ZeRO-1's parameters: half
    assert own["dp", "all_reduce"] == fp32["dp", "all_reduce"]         # fp32 gradients in both
    assert own["tp", "all_gather"] == fp32["tp", "all_gather"]         # activations in bf16 in both
    doc = yaml.safe_load(Path(plan).read_text())
    doc["training"]["precision"] = "fp32"
    path = tmp_path / "fp32.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["collectives", str(path)]) == 0
    assert _rows(capsys.readouterr().out)["dp", "broadcast"] == fp32["dp", "broadcast"]


def test_schedule_and_collectives_print_dualpipev_as_torch_orders_it(tmp_path, capsys):
    """Issue 50: the grid in torch's notation, overlapped pairs as ``(F;B)OVERLAP_F_B``, lowered with
    the sends after the pair; the collectives list its pipeline sends, none inside a rank's V."""
    import yaml

    doc = yaml.safe_load((ROOT / "plans/llama3-70b-h100.yaml").read_text())
    doc["parallel"].update(vpp=2, schedule="dualpipev")
    doc["training"]["global_batch"] = 16   # 8 micro-batches a pipeline: at least the 2 x pp stages
    path = tmp_path / "dualpipev.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["schedule", str(path), "--all"]) == 0
    out = capsys.readouterr().out
    assert "dualpipev, pp=4, vpp=2, 8 micro-batches" in out and "Rank 3: 3F0 4F0 3F1 4F1" in out
    assert "(0F7;7B3)OVERLAP_F_B" in out
    assert main(["schedule", str(path), "--lowered", "--all", "--json"]) == 0
    grid = json.loads(capsys.readouterr().out)
    rank0 = grid["0"]
    pair = rank0.index("(0F7;7B3)OVERLAP_F_B")
    assert rank0[pair + 1] == "0SEND_F7"   # the paired forward's activation leaves after the pair
    assert not any(a.startswith(("3SEND_F", "4SEND_B")) for a in grid["3"])   # stages 3 and 4: one rank
    assert main(["collectives", str(path)]) == 0
    assert "pp   send" in capsys.readouterr().out


def test_memory_says_what_the_plan_holds_without_the_allocators_assumed_margin(tmp_path, capsys):
    """Meta's Llama 3 405B layout (tp 8, pp 16 with a layer fewer on the first and last stages, dp 128;
    Llama 3 paper Sec. 3.3.2) is over 80 GiB only with the allocator's assumed 10%: the command says so."""
    import yaml

    from simcore.model.step_costs import memory_report
    from simcore.plan.load import load_plan

    doc = {"name": "meta-405b", "model": {"name": "llama3-405b", "seq_len": 8192},
           "cluster": {"node": "dgx-h100", "nodes": 2048, "fabric": "roce-400"},
           "parallel": {"tp": 8, "pp": 16, "dp": 128, "zero": 2, "sequence_parallel": True, "schedule": "1f1b",
                        "stage_layers": [7] + [8] * 14 + [7]},
           "training": {"global_batch": 2048, "micro_batch": 1, "recompute": "none", "flash_attention": True}}
    path = tmp_path / "meta.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["memory", str(path)]) == 0
    out = capsys.readouterr().out
    report = memory_report(load_plan(str(path)))
    bare = max(r["total"] - r["terms"]["allocator_margin"] for r in report["ranks"]) / 2**30
    assert not report["fits"] and bare < 80
    assert "fits: NO" in out
    assert "without the allocator's assumed 10% margin" in out and f"{bare:.2f} GiB, fits" in out
    doc["training"]["allocator_margin"] = 0
    path.write_text(yaml.safe_dump(doc))
    assert main(["memory", str(path)]) == 0
    out = capsys.readouterr().out
    assert "fits: yes" in out and "without the allocator" not in out


def test_collectives_say_an_int8_plan_reduces_its_buckets_at_one_byte(tmp_path, capsys):
    """The footer named fp32's 4 bytes for an int8 plan, whose DDP buckets move at 1 byte and a scale."""
    import yaml

    doc = {"model": "gpt-1.7b", "cluster": {"node": "dgx-h100", "nodes": 1},
           "parallel": {"tp": 1, "pp": 1, "dp": 8, "zero": 0}, "training": {"global_batch": 8, "grad_compression": "int8"}}
    path = tmp_path / "int8.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["collectives", str(path)]) == 0
    out = capsys.readouterr().out
    assert "(DDP buckets at 1 and an fp32 scale a group: grad_compression int8)" in out.strip().splitlines()[-1]
    kinds = {tuple(line.split()[:2]) for line in out.splitlines() if line.startswith("  dp ")}
    assert kinds == {("dp", "all_to_all"), ("dp", "all_gather")}
