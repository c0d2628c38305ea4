"""Differential tests of the executor's parallel layouts (tier 3 in STYLE.md).

Every layout runs one fp32 optimizer step on 2 or 4 gloo ranks; the loss and every
parameter's update must equal the single-process run of the same model on the same global
batch (picotron's tests/test_tensor_parallel.py does this for one layer; here for the whole
model and torch's own wrappers). Plans use SGD so that the update is lr * gradient and the
comparison checks gradients exactly. The collectives each layout issues are counted
(executors.record.record_collectives) and checked against hand-worked counts.

Ranks are forked from this process (torch already imported), which keeps a batch of layouts
to a few seconds on two cores; several layouts share one launch.
"""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch
import torch.distributed as dist
import torch.testing  # noqa: F401  (imported before the ranks fork, like everything they use)

from executors import launch, moe, parallel, procs, record, watchdog
from executors.model import build_model, loss_fn
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import Fp8Recipe, Offload, Precision

LR = 0.5
#: fp32 sums in another order: relative error of the updates well under 1e-4.
RTOL, ATOL = 1e-4, 1e-6

GPT = dict(name="test-gpt", layers=4, hidden=32, heads=4, vocab=64, seq_len=16, tied_embeddings=False)
LLAMA = dict(GPT, name="test-llama", kv_heads=2, gated_mlp=True, position_embedding="rope", ffn_hidden=64)


def fp8_plan(plan, gather: bool):
    """``plan`` under torchao's tensorwise float8, its weights gathered in FP8 where ``gather``."""
    return dataclasses.replace(plan, training=dataclasses.replace(plan.training, fp8_recipe=Fp8Recipe.TENSORWISE,
                                                                  fp8_param_gather=gather))


def make_plan(model=GPT, *, gb=8, mb=1, optimizer="sgd", precision="fp32", recompute="none",
              grad_compression="none", **parallel):
    gpus = parallel.get("tp", 1) * parallel.get("pp", 1) * parallel.get("dp", 1)
    doc = {"model": model, "cluster": {"node": "localhost", "gpus_per_node": 4},
           "parallel": {"dp": 1, **parallel},
           "training": {"global_batch": gb, "micro_batch": mb, "optimizer": optimizer, "precision": precision,
                        "recompute": recompute, "grad_compression": grad_compression}}
    doc["training"]["precision"] = "fp32"
    plan = plan_from_dict(doc)
    assert plan.parallel.gpus == gpus
    # the precision is set past check_plan: a calibrated host profile may list no bf16 peak
    return dataclasses.replace(plan, training=dataclasses.replace(plan.training, precision=Precision(precision)))


def _clean(name: str) -> str:
    return re.sub(r"(_checkpoint_wrapped_module|module|_fsdp_wrapped_module)\.", "", name)


def full_params(trainer) -> dict[str, torch.Tensor]:
    """Every parameter this rank holds, gathered to its full shape, by model name."""
    out = {}
    for part in trainer.parts:
        for name, p in part.named_parameters():
            t = p.full_tensor() if isinstance(p, torch.distributed.tensor.DTensor) else p
            out[_clean(name)] = t.detach().clone()
    return out


STEPS = 2
"""Two steps: the second is a steady-state step (the pipeline stages infer shapes and DDP
rebuilds its buckets on the first), and its collectives are the ones counted."""


def train_steps(rank, world, device, plans):
    """Run STEPS steps of each plan on this rank; return losses, parameters, collectives."""
    out = []
    for plan in plans:
        mesh = parallel.build_mesh(plan, "cpu")
        trainer = parallel.build_trainer(plan, mesh, device, seed=0, lr=LR)
        rec = record.Recorder(rank=rank, axis_of=record.axis_map(mesh))
        losses = []
        with record.record_collectives(rec):
            for step in range(STEPS):
                tokens, labels = launch.local_batch(plan, step, 0, mesh.get_local_rank("dp"))
                rec.counts.clear()
                rec.enabled = True
                rec.start_step()
                loss = trainer.step(tokens, labels)
                rec.enabled = False
                losses.append(launch.global_loss(plan, loss, device))
                watchdog.heartbeat()   # progress: the timeout bounds a step, not the batch of layouts
        out.append({"losses": losses, "params": full_params(trainer), "counts": dict(rec.counts)})
        dist.barrier()
    return out


def reference(plan) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The single-process run: the whole global batch, STEPS SGD steps. An MoE model runs
    it a micro-batch at a time, as the ranks do: an expert's capacity and the auxiliary loss
    are per call (``executors.moe``)."""
    model = build_model(plan.model, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=parallel.SGD_MOMENTUM)
    calls = plan.training.global_batch // plan.training.micro_batch if plan.model.moe else 1
    moe.set_aux_scale(model, calls)
    losses = []
    for step in range(STEPS):
        rows = launch.batch(plan, step, 0)
        opt.zero_grad()
        total = 0.0
        for chunk in rows.chunk(calls):
            loss = loss_fn(model(chunk[:, :-1]), chunk[:, 1:]) / calls
            loss.backward()
            total += loss.item()
        opt.step()
        losses.append(total)
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def check_against_reference(plan, results, rtol=RTOL, atol=ATOL, loss_rtol=1e-5):
    """Loss of every step and every parameter's total update equal the reference's."""
    init = {n: p.detach() for n, p in build_model(plan.model, seed=0).named_parameters()}
    ref_losses, ref = reference(plan)
    assert results[0]["losses"] == pytest.approx(ref_losses, rel=loss_rtol)
    merged = {}
    for r in results:
        merged.update(r["params"])
    assert set(merged) == set(ref), set(merged) ^ set(ref)
    for name, p in ref.items():
        torch.testing.assert_close(merged[name] - init[name], p - init[name], rtol=rtol, atol=atol,
                                   msg=lambda m: f"{name}: {m}")


def run_layouts(world, plans):
    results = procs.spawn(train_steps, world, (plans,), timeout_s=240, start_method="fork")
    return [[results[r][i] for r in range(world)] for i in range(len(plans))]


def counts(results, rank=0):
    return results[rank]["counts"]


def relative_update_error(plan, results) -> float:
    """Largest ||update - reference update|| / ||reference update|| over the parameters."""
    init = {n: p.detach() for n, p in build_model(plan.model, seed=0).named_parameters()}
    _, ref = reference(plan)
    merged = {k: v for r in results for k, v in r["params"].items()}
    return max(((merged[n] - p).norm() / (p - init[n]).norm()).item() for n, p in ref.items())


def whole_update_error(plan, results) -> float:
    """||update - reference update|| / ||reference update|| over all the parameters at once (a
    quantized reduction rounds a tensor small beside its group's largest coarsely, up to its own
    size: the per-tensor figure of ``relative_update_error`` would judge that tensor alone)."""
    init = {n: p.detach() for n, p in build_model(plan.model, seed=0).named_parameters()}
    ref = reference(plan)[1]
    got = {k: v for r in results for k, v in r["params"].items()}
    diff = torch.cat([(got[n] - p).flatten() for n, p in ref.items()]).norm()
    update = torch.cat([(p - init[n]).flatten() for n, p in ref.items()]).norm()
    return (diff / update).item()


# --------------------------------------------------------------------------- layouts

L = GPT["layers"]
N_MB_DP2 = 4  # global_batch 8 / (dp 2 * micro_batch 1)
N_MB = 8      # global_batch 8 / (dp 1 * micro_batch 1)

TWO_RANK = {
    "dp2": make_plan(dp=2),
    "dp2-tied": make_plan(dict(GPT, tied_embeddings=True), dp=2),
    "zero1-adamw-free": make_plan(dp=2, zero=1),
    "zero2": make_plan(dp=2, zero=2),
    "zero3": make_plan(dp=2, zero=3),
    "zero3-output-kept": make_plan(dp=2, zero=3, fsdp_root="output_kept"),   # torchtitan's [norm, output] group
    "zero3-kept": make_plan(dp=2, zero=3, fsdp_root="kept"),
    "tp2": make_plan(LLAMA, tp=2),
    "tp2-sp": make_plan(LLAMA, tp=2, sequence_parallel=True),
    "dp2-recompute-full": make_plan(LLAMA, dp=2, recompute="full"),
    "tp2-recompute-selective": make_plan(LLAMA, tp=2, recompute="selective"),
    "moe-dp2": make_plan(dict(LLAMA, experts=4, top_k=2), dp=2),
    "moe-tp2-sp": make_plan(dict(LLAMA, experts=4, top_k=2), tp=2, sequence_parallel=True),
    "pp2-gpipe": make_plan(pp=2, schedule="gpipe"),
    "pp2-1f1b": make_plan(pp=2, schedule="1f1b"),
    "pp2-interleaved": make_plan(pp=2, vpp=2, schedule="interleaved-1f1b"),
    "pp2-zero-bubble": make_plan(pp=2, schedule="zero-bubble"),
    "dp2-powersgd": make_plan(dp=2, grad_compression="powersgd"),
    "dp2-fp16-compression": make_plan(dp=2, grad_compression="fp16"),
    "dp2-int8": make_plan(dp=2, grad_compression="int8"),
    "zero3-int8": make_plan(dp=2, zero=3, grad_compression="int8"),
    "dp2-bf16": make_plan(LLAMA, dp=2, precision="bf16"),
    # torchao's float8 (on this CPU through torch 2.13's torch._scaled_mm): weights cast per GEMM, or
    # gathered in FP8 by FSDP2 with their scales precomputed after each step (training.fp8_param_gather)
    "zero3-fp8": fp8_plan(make_plan(LLAMA, dp=2, zero=3, precision="fp8"), gather=False),
    "zero3-fp8-gather": fp8_plan(make_plan(LLAMA, dp=2, zero=3, precision="fp8"), gather=True),
}
FOUR_RANK = {
    "dp2xpp2-1f1b": make_plan(dp=2, pp=2),
    "tp2xpp2-gpipe": make_plan(LLAMA, tp=2, pp=2, schedule="gpipe"),
    "dp2xtp2": make_plan(LLAMA, dp=2, tp=2),
    "dp2xtp2-sp-zero3": make_plan(LLAMA, dp=2, tp=2, sequence_parallel=True, zero=3),
    "dp2xpp2-zero2-interleaved": make_plan(dp=2, pp=2, vpp=2, zero=2, schedule="interleaved-1f1b"),
    "dp4-hsdp2-zero2": make_plan(dp=4, zero=2, dp_replicate=2, gb=8),   # FSDP2 on a (replicate, shard) mesh
    "dp4-hsdp2-zero3-int8": make_plan(dp=4, zero=3, dp_replicate=2, gb=8, grad_compression="int8"),
}
EXACT = {k for k in TWO_RANK if k not in ("dp2-fp16-compression", "dp2-int8", "zero3-int8", "dp2-bf16", "zero3-fp8",
                                          "zero3-fp8-gather")} | \
    {k for k in FOUR_RANK if k != "dp4-hsdp2-zero3-int8"}


@pytest.fixture(scope="module")
def two_rank():
    return dict(zip(TWO_RANK, run_layouts(2, list(TWO_RANK.values()))))


@pytest.fixture(scope="module")
def four_rank():
    return dict(zip(FOUR_RANK, run_layouts(4, list(FOUR_RANK.values()))))


@pytest.mark.parametrize("name", [k for k in TWO_RANK if k in EXACT])
def test_two_rank_layout_matches_single_process(two_rank, name):
    check_against_reference(TWO_RANK[name], two_rank[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", [k for k in FOUR_RANK if k in EXACT])
def test_four_rank_layout_matches_single_process(four_rank, name):
    check_against_reference(FOUR_RANK[name], four_rank[name])


def test_fp16_gradient_compression_is_close(two_rank):
    # fp16 keeps 11 significant bits: the averaged gradients differ by ~1e-3 relative
    name = "dp2-fp16-compression"
    assert two_rank[name][0]["losses"][0] == pytest.approx(reference(TWO_RANK[name])[0][0], rel=1e-6)
    assert 0 < relative_update_error(TWO_RANK[name], two_rank[name]) < 5e-3


def test_int8_gradient_compression_is_close(two_rank):
    # the int8 hook (executors.int8_hook): the forward is exact, the averaged gradients within
    # int8's two roundings (a step of 1/127 of each group's largest gradient), two all-to-alls
    # and two all-gathers (one bucket, two steps) and no all-reduce
    # of the whole update (a group of 8,000 spans tensors: one whose gradients are small beside
    # its group's largest is rounded coarsely, up to its own size, which the bound allows)
    name = "dp2-int8"
    assert two_rank[name][0]["losses"][0] == pytest.approx(reference(TWO_RANK[name])[0][0], rel=1e-6)
    assert 0 < whole_update_error(TWO_RANK[name], two_rank[name]) < 5e-2
    assert counts(two_rank[name]) == {("all_to_all", "dp"): 1, ("all_gather", "dp"): 1}


def test_int8_reduce_scatter_under_fsdp2_is_close(two_rank):
    # FSDP2's int8 reduce-scatter (executors.int8_hook.Int8ReduceScatter): one rounding of each rank's
    # copy (no second quantization, no all-gather): the forward exact, the update within int8's step
    # (the same small-beside-its-group tensors as the DDP hook's), an all-to-all where FSDP2's own
    # reduce-scatter was, once per unit and micro-batch
    name = "zero3-int8"
    assert two_rank[name][0]["losses"][0] == pytest.approx(reference(TWO_RANK[name])[0][0], rel=1e-6)
    assert 0 < whole_update_error(TWO_RANK[name], two_rank[name]) < 5e-2
    units = L + 1
    assert counts(two_rank[name]) == {("all_gather", "dp"): 2 * N_MB_DP2 * units, ("all_to_all", "dp"): N_MB_DP2 * units}


@pytest.mark.slow
def test_int8_reduce_scatter_under_hybrid_sharding_is_close(four_rank):
    # HSDP (2 replicas of 2 shards): the int8 all-to-all over each shard group, then FSDP2's own fp32
    # all-reduce of the shard over the replicas (torch 2.13 has no custom all-reduce): the forward exact,
    # the update within int8's one rounding, as over one group
    name = "dp4-hsdp2-zero3-int8"
    assert four_rank[name][0]["losses"][0] == pytest.approx(reference(FOUR_RANK[name])[0][0], rel=1e-6)
    assert 0 < whole_update_error(FOUR_RANK[name], four_rank[name]) < 5e-2
    c = counts(four_rank[name])
    assert c[("all_to_all", "dp_shard")] == c[("all_reduce", "dp_replicate")] > 0
    assert not any(kind == "reduce_scatter" for kind, _ in c)


def test_bf16_autocast_is_close(two_rank):
    # bf16 keeps 8 significant bits: losses within 1%, updates within a few percent
    name = "dp2-bf16"
    ref_losses, _ = reference(TWO_RANK[name])
    assert two_rank[name][0]["losses"] == pytest.approx(ref_losses, rel=1e-2)
    assert 0 < relative_update_error(TWO_RANK[name], two_rank[name]) < 5e-2


def test_fp8_all_gather_moves_bytes_not_the_math(two_rank):
    # the FP8 all-gather gathers what the per-GEMM cast would make: the same tensorwise scale (the
    # full weight's amax, from the shards' amax all-reduced), so the losses and the updates are those
    # of float8 without it; float8 itself is within FP8's rounding of the fp32 reference
    cast, gathered = two_rank["zero3-fp8"], two_rank["zero3-fp8-gather"]
    assert gathered[0]["losses"] == pytest.approx(cast[0]["losses"], rel=1e-6)
    for name, p in cast[0]["params"].items():
        torch.testing.assert_close(gathered[0]["params"][name], p, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    assert cast[0]["losses"] == pytest.approx(reference(TWO_RANK["zero3-fp8"])[0], rel=5e-2)
    units = LLAMA["layers"] + 1
    assert counts(gathered) == {("all_gather", "dp"): 2 * N_MB_DP2 * units, ("reduce_scatter", "dp"): N_MB_DP2 * units,
                                ("all_reduce", "dp"): 1}   # torchao's amax all-reduce after the step
    assert counts(cast) == {("all_gather", "dp"): 2 * N_MB_DP2 * units, ("reduce_scatter", "dp"): N_MB_DP2 * units}


# --------------------------------------------------------------------------- collectives

def test_data_parallel_collectives(two_rank):
    # DDP: one bucket (the model is far below 25 MB), all-reduced after the last micro-batch only
    assert counts(two_rank["dp2"]) == {("all_reduce", "dp"): 1}
    # ZeRO-1: the same all-reduce, then one broadcast of each rank's parameter bucket
    assert counts(two_rank["zero1-adamw-free"]) == {("all_reduce", "dp"): 1, ("broadcast", "dp"): 2}
    # FSDP2, L blocks + the root = L + 1 units, gradients reduce-scattered every micro-batch;
    # ZeRO-2 gathers each unit once per micro-batch, ZeRO-3 again in backward
    units = L + 1
    assert counts(two_rank["zero2"]) == {("all_gather", "dp"): N_MB_DP2 * units,
                                         ("reduce_scatter", "dp"): N_MB_DP2 * units}
    assert counts(two_rank["zero3"]) == {("all_gather", "dp"): 2 * N_MB_DP2 * units,
                                         ("reduce_scatter", "dp"): N_MB_DP2 * units}


def test_tensor_parallel_collectives(two_rank):
    # Megatron TP: per block 2 all-reduces forward (wo, w2) and 2 backward (the "f" of
    # attention and MLP); plus the vocabulary-parallel embedding forward and the logits
    # input backward; the logits stay vocabulary-sharded and loss_parallel all-reduces the
    # row maximum, the sum of exponentials and the target's log-probability per micro-batch
    assert counts(two_rank["tp2"]) == {("all_reduce", "tp"): N_MB * (4 * L + 2 + 3)}


def test_pipeline_collectives(two_rank):
    # two stages: stage 0 sends each micro-batch's activation, stage 1 its input gradient
    for name in ("pp2-gpipe", "pp2-1f1b", "pp2-zero-bubble"):
        assert counts(two_rank[name]) == {("send", "pp"): N_MB, ("recv", "pp"): N_MB}, name
    # four virtual stages on two ranks: 3 boundaries x 2 directions x N_MB, half sent by each rank
    assert counts(two_rank["pp2-interleaved"]) == {("send", "pp"): 3 * N_MB, ("recv", "pp"): 3 * N_MB}


# --------------------------------------------------------------------------- user errors

def test_offload_on_cpu_is_a_clear_error():
    plan = make_plan(dp=2, zero=3)
    plan = dataclasses.replace(plan, training=dataclasses.replace(plan.training, offload=Offload.OPTIMIZER_PARAMS))
    with pytest.raises(ValueError, match="offload=optimizer\\+params needs an accelerator"):
        parallel.check_executable(plan, "cpu")


def test_offload_of_the_optimizer_alone_is_a_clear_error():
    plan = make_plan(dp=2, zero=3)
    plan = dataclasses.replace(plan, training=dataclasses.replace(plan.training, offload=Offload.OPTIMIZER))
    with pytest.raises(ValueError, match="CPUOffloadPolicy keeps the parameters and gradients on the host too"):
        parallel.check_executable(plan, "cuda")


@pytest.mark.parametrize("recipe, device, message", [
    (Fp8Recipe.TENSORWISE, "cpu", r"fp8 needs torchao \(torchao.float8\) and an FP8 GEMM"),
    (Fp8Recipe.DELAYED, "cuda", "fp8_recipe=delayed is priced, not run"),
])
def test_fp8_the_executor_cannot_run_is_a_clear_error(recipe, device, message):
    import executors.support as support

    plan = make_plan(dp=2)
    fp8 = dataclasses.replace(plan, training=dataclasses.replace(plan.training, precision=Precision.FP8,
                                                                 fp8_recipe=recipe))
    with pytest.MonkeyPatch.context() as mp:
        # float8 runs on the GPU (the recipe rule), not on the CPU (no torchao, say): either way one sentence
        mp.setattr(support, "float8_runs", lambda device_type: device_type == "cuda")
        with pytest.raises(ValueError, match=message):
            parallel.check_executable(fp8, device)


@pytest.mark.parametrize("optimizer, parallel_kw, message", [
    ("adamw8bit", {"dp": 2}, "optimizer=adamw8bit is priced, not run"),
    ("adafactor", {"tp": 2}, "optimizer=adafactor is priced, not run, with DTensor parameters"),
    ("adafactor", {"dp": 2, "zero": 3}, "optimizer=adafactor is priced, not run, with DTensor parameters"),
])
def test_optimizers_the_executor_cannot_run_are_clear_errors(optimizer, parallel_kw, message):
    with pytest.raises(ValueError, match=message):
        parallel.check_executable(make_plan(LLAMA, optimizer=optimizer, **parallel_kw), "cpu")
    parallel.check_executable(make_plan(LLAMA, optimizer="adafactor", dp=2, zero=1), "cpu")   # plain parameters


def test_fp16_on_cpu_is_a_clear_error():
    plan = make_plan(dp=2)  # replace(), not the Plan file: a calibrated CPU profile may refuse fp16 already
    fp16 = dataclasses.replace(plan, training=dataclasses.replace(plan.training, precision=Precision.FP16))
    with pytest.raises(ValueError, match="fp16 needs a GPU"):
        parallel.check_executable(fp16, "cpu")


def test_schedule_torch_cannot_run_is_a_value_error():
    plan = make_plan(pp=2, gb=1, schedule="1f1b")  # one micro-batch on two stages
    with pytest.raises(ValueError, match="parallel.schedule=1f1b: torch's Schedule1F1B cannot run 1 micro-batches"):
        run_layouts(2, [plan])
