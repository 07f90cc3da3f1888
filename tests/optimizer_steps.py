"""The gradients each optimizer step was handed, for tests that claim two learners take the same step.

Why not compare the weights after the step: Adam's first update of a parameter is lr * g / (|g| + eps)
(m_hat = g, v_hat = g^2), whose slope in g is lr * eps / (|g| + eps)^2 — up to lr / eps = 1e6 at the
tests' lr 1e-2 for a gradient near zero. Two gradients equal up to float32 summation order (another
CPU's kernels, AVX2 against AVX-512/AMX, sum in another order) can then move such a weight by
different amounts far above any float32 bound, while every gradient agrees. The claim "the same step"
is that the optimizer was handed the same gradients; that is what these record and compare.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

# float32 sums in another order: about sqrt(n) * 2^-24 relative per reduction of n terms, for the few
# thousand terms a tiny model's gradient entry sums over, ~1e-6 of the gradient's largest entry. rtol on
# top covers large entries, each its own sum of products with relative error ~1e-6 too.
GRAD_ATOL_OF_MAX = 1e-6
GRAD_RTOL = 1e-5


@contextmanager
def gradients_of_each_step() -> Iterator[list[list[torch.Tensor]]]:
    """Every torch optimizer step taken inside the block (DeepSpeed's included: at ZeRO 3 the inner
    AdamW's flat fp32 partitions), as one list per step of the gradients of its parameters in
    parameter-group order, copied before the step. A parameter with no gradient is left out."""
    steps: list[list[torch.Tensor]] = []

    def record(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        steps.append([p.grad.detach().clone() for group in optimizer.param_groups for p in group["params"]
                      if p.grad is not None])

    handle = register_optimizer_step_pre_hook(record)
    try:
        yield steps
    finally:
        handle.remove()


def assert_same_gradients(got: list[list[torch.Tensor]], want: list[list[torch.Tensor]]) -> None:
    """Each step handed the same gradients, within float32 summation order (GRAD_ATOL_OF_MAX)."""
    assert len(got) == len(want) > 0, (len(got), len(want))
    for k, (g_step, w_step) in enumerate(zip(got, want)):
        assert len(g_step) == len(w_step) > 0, (k, len(g_step), len(w_step))
        scale = max(float(w.abs().max()) for w in w_step)
        assert scale > 0, f"step {k}: every gradient is zero, so agreeing proves nothing"
        for i, (g, w) in enumerate(zip(g_step, w_step)):
            assert g.shape == w.shape, (k, i, g.shape, w.shape)
            err = float((g - w).abs().max())
            assert torch.allclose(g, w, atol=GRAD_ATOL_OF_MAX * scale, rtol=GRAD_RTOL), \
                f"step {k}, parameter {i}: gradients differ by {err:.3g} (largest gradient {scale:.3g})"
