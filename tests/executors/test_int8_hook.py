"""The executor's quantized gradient all-reduce (``executors.int8_hook``, ``training.grad_compression:
int8`` and ``int4``) on 2 gloo ranks: its average equals the exact all-reduce's within the quantization
bound, element by element, and its calls are the ones ``simcore.model.ddp_hooks`` prices."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from executors import int8_hook, procs, record
from simcore.model import ddp_hooks as hooks

#: Bucket sizes: below the world, not a multiple of it, one group a chunk, several groups (padded).
SIZES = (1, 7, 4096, 3 * hooks.INT8_GROUP + 5)
#: Each size at int8's and int4's width.
CASES = [(n, bits) for bits in (8, 4) for n in SIZES]


class _Bucket:
    """What the hook reads of DDP's ``GradBucket``: its flat buffer."""

    def __init__(self, buffer: torch.Tensor) -> None:
        self._buffer = buffer

    def buffer(self) -> torch.Tensor:
        return self._buffer


def _average_both_ways(rank, world, device):
    out = []
    for i, (n, bits) in enumerate(CASES):
        gen = torch.Generator().manual_seed(100 * i + rank)
        grad = torch.randn(n, generator=gen) * torch.logspace(-3, 1, n)   # magnitudes over 4 decades
        exact = grad.clone()
        dist.all_reduce(exact)
        exact /= world
        k, g = hooks.int8_layout(n, world, bits)
        padded = torch.nn.functional.pad(grad, (0, world * k * g - n)).view(world * k, g)
        absmax = torch.empty(world * world * k)   # every rank's absmax of every group
        dist.all_gather_into_tensor(absmax, padded.abs().amax(1))
        rec = record.Recorder(rank=rank, axis_of={frozenset(range(world)): "dp"})
        with record.record_collectives(rec):
            state = int8_hook.Int8State(bits=bits, feedback=False)
            got = int8_hook.int8_hook(state if bits == 4 else None, _Bucket(grad.clone())).wait()
        calls = sorted((kind, axis, int(nbytes)) for axis, kind, _name, _s, _e, nbytes in rec.spans)
        out.append({"n": n, "bits": bits, "exact": exact, "got": got, "absmax": absmax.view(world, world * k),
                    "calls": calls})
    return out


@pytest.fixture(scope="module")
def two_rank():
    return procs.spawn(_average_both_ways, 2, timeout_s=120, start_method="fork")


@pytest.mark.parametrize("i", range(len(CASES)))
def test_the_average_is_the_exact_one_within_the_quantization_bound(two_rank, i):
    world = len(two_rank)
    for rank in range(world):
        r = two_rank[rank][i]
        n, bits = r["n"], r["bits"]
        g = hooks.int8_layout(n, world, bits)[1]
        assert r["got"].shape == (n,) and r["got"].dtype == torch.float32
        # each rank's copy is rounded to half a step (absmax / 127 / 2) of its group; the sum, whose
        # absmax is at most the ranks' summed, is rounded again: the average is within
        # 2 x (the ranks' absmax summed) / 254 / world of the exact one (fp32's own rounding beside)
        half_steps = r["absmax"].sum(0) / (2 * int8_hook.QMAX[bits])
        bound = (2 * half_steps / world).repeat_interleave(g)[:n] * (1 + 1e-3) + 1e-30
        err = (r["got"] - r["exact"]).abs()
        assert bool((err <= bound).all()), float((err / bound).max())
        assert torch.equal(r["got"], two_rank[0][i]["got"])   # every rank holds the same average
        if n >= 4096:   # lossy: a few percent of the norm where a group spans four decades (int4: more)
            assert 0 < (err.norm() / r["exact"].norm()).item() < (5e-2 if bits == 8 else 0.5)


@pytest.mark.parametrize("i", range(len(CASES)))
def test_the_hook_makes_the_calls_the_model_prices(two_rank, i):
    n, bits = two_rank[0][i]["n"], two_rank[0][i]["bits"]
    b = hooks.int8_call_bytes(n, 2, bits)
    assert two_rank[0][i]["calls"] == [("all_gather", "dp", b), ("all_to_all", "dp", b)]
    method = "int8" if bits == 8 else "int4"
    assert hooks.bucket_collectives(method, [(n,)], 1, 4, 2) == [("all_to_all", b), ("all_gather", b)]
    # bits / 8 of a byte and an fp32 scale a group of at most INT8_GROUP: a quarter (an eighth) of
    # fp32's bytes and a little more, or a tiny bucket's padding and scales
    assert 0 < b <= (bits / 8 + hooks.SCALE_BYTES / (hooks.INT8_GROUP // 2)) * n + 2 * (hooks.SCALE_BYTES + 1) * 2


# --------------------------------------------------------------------------- error feedback (int8_ef)

class _IndexedBucket(_Bucket):
    def index(self) -> int:
        return 0


STEPS = 20


def _repeat_the_same_gradient(rank, world, device):
    """The same bucket averaged ``STEPS`` times, without and with error feedback: the running sums
    of the hook's averages against the exact one's."""
    n = 3 * hooks.INT8_GROUP + 5
    gen = torch.Generator().manual_seed(7 + rank)
    grad = torch.randn(n, generator=gen) * torch.logspace(-3, 1, n)
    exact = grad.clone()
    dist.all_reduce(exact)
    exact /= world
    state = int8_hook.Int8State(group=None)
    plain, fed = torch.zeros(n), torch.zeros(n)
    for _ in range(STEPS):
        plain += int8_hook.int8_hook(None, _IndexedBucket(grad.clone())).wait()
        fed += int8_hook.int8_hook(state, _IndexedBucket(grad.clone())).wait()
    return {"exact": exact * STEPS, "plain": plain, "fed": fed, "errors": (state.worker[0].numel(),
                                                                          state.server[0].numel())}


def test_error_feedback_keeps_the_running_sum_on_the_exact_one():
    """Without feedback a constant gradient's rounding repeats every step, so the running sum drifts
    STEPS times one step's error; with it each step sends what the last one lost, and the drift stays
    about one step's (Seide et al. 2014; Karimireddy et al. 2019). Its errors are the padded bucket's
    and this rank's chunk's, the bytes the model keeps (``ddp_hooks.ef_error_bytes``)."""
    out = procs.spawn(_repeat_the_same_gradient, 2, timeout_s=120, start_method="fork")
    for r in out:
        drift_plain = (r["plain"] - r["exact"]).norm() / r["exact"].norm()
        drift_fed = (r["fed"] - r["exact"]).norm() / r["exact"].norm()
        assert drift_fed < drift_plain / 5, (float(drift_fed), float(drift_plain))
        assert 4 * sum(r["errors"]) == hooks.ef_error_bytes(3 * hooks.INT8_GROUP + 5, 2)
    assert torch.equal(out[0]["fed"], out[1]["fed"])   # every rank holds the same averages
