"""agentrl.learner.step_parts: the micro-batch split and the one gradient-accumulation routine, against
hand-written values and a recording stand-in for a DeepSpeed engine (a unit test of the routine alone)."""

from __future__ import annotations

import torch

from agentrl.learner.step_parts import accumulate, micro_slices


def test_micro_slices_are_exactly_n_contiguous_and_cover_the_rows():
    assert micro_slices(range(3, 8), 3) == [slice(3, 5), slice(5, 7), slice(7, 8)]
    assert micro_slices(range(0, 2), 4) == [slice(0, 1), slice(1, 2), slice(2, 2), slice(2, 2)]
    assert micro_slices(range(4, 4), 2) == [slice(4, 4), slice(4, 4)]


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def set_gradient_accumulation_boundary(self, flag: bool) -> None:
        self.calls.append(("boundary", flag))

    def backward(self, loss: torch.Tensor, scale_wrt_gas: bool) -> None:
        self.calls.append(("backward", float(loss), scale_wrt_gas))

    def step(self) -> None:
        self.calls.append(("step",))


def test_accumulate_sets_the_boundary_on_the_last_and_steps_once():
    engine, seen = Recorder(), []
    accumulate(engine, 3, lambda i: torch.tensor(float(i + 1)), seen.append)
    assert engine.calls == [("boundary", False), ("backward", 1.0, False), ("boundary", False),
                            ("backward", 2.0, False), ("boundary", True), ("backward", 3.0, False), ("step",)]
    assert seen == [0, 1, 2]
