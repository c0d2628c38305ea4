"""The serving loop on a GPU (executors/serving_loop.py with the model, its paged KV cache and the
iteration's index tensors on CUDA). CI has no GPU: these skip there, and ran on the lent H200
(bench/RESULTS.md, "the serving loop on a GPU")."""
from __future__ import annotations

import pytest
import torch

from executors.serving_kv import reference_tokens
from executors.serving_loop import LoopLimits, run_loop
from simcore.serving.load import serving_from_dict
from trainplan.serving_run import loop_model, requests

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs a CUDA device: the loop's GPU path")]

MODEL = {"name": "tiny-gpu", "layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "vocab": 256, "gated_mlp": True,
         "position_embedding": "rope", "tied_embeddings": False, "seq_len": 64}


def _plan(dtype: str):
    return serving_from_dict({
        "name": "tiny-gpu-loop", "model": MODEL, "hardware": {"node": "localhost"},
        "precision": {"weights": dtype, "activations": dtype, "kv_cache": dtype},
        "scheduler": {"max_num_seqs": 3, "max_num_batched_tokens": 8}, "kv_cache": {"block_size": 4},
        "traffic": {"arrival": "offline", "num_requests": 8, "prompt_len": 11, "output_len": 6, "seed": 3}})


def _serve(plan, kv_blocks: int):
    model = loop_model(plan)
    arrivals, prompts, _, output = requests(plan)
    s = plan.scheduler
    limits = LoopLimits(s.max_num_seqs, s.max_num_batched_tokens, s.chunked_prefill, kv_blocks, plan.kv_cache.block_size)
    return model, prompts, output, run_loop(model, limits, arrivals.tolist(), prompts, output.tolist())


def test_the_cache_on_a_gpu_decodes_as_the_full_model_through_preemption():
    model, prompts, output, rec = _serve(_plan("fp32"), kv_blocks=9)
    assert model.output.weight.is_cuda and rec.preemptions > 0
    for prompt, out, n in zip(prompts, rec.outputs, output):
        assert out == reference_tokens(model, prompt, n)


def test_bf16_serves_every_token_on_a_gpu():
    model, _, output, rec = _serve(_plan("bf16"), kv_blocks=100)
    assert model.output.weight.dtype == torch.bfloat16
    assert [len(o) for o in rec.outputs] == output.tolist() and all(t == t for t in rec.finish)
