"""A model of eight small blocks whose passes call ``on_pass(phase, index)``: the tests of
``Resizer.interruptible`` write a new world from a chosen block's "forward" or "backward"
pass (tests/runtime/test_interruptible.py, and its two-worker job interruptible_job.py)."""

import torch


class Backward(torch.autograd.Function):
    """The identity, whose backward pass calls back: the block's gradient is coming in."""

    @staticmethod
    def forward(ctx, x, index, on_pass):
        ctx.index, ctx.on_pass = index, on_pass
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.on_pass("backward", ctx.index)
        return grad, None, None


class Block(torch.nn.Module):
    def __init__(self, index: int, on_pass):
        super().__init__()
        self.linear, self.index, self.on_pass = torch.nn.Linear(4, 4), index, on_pass

    def forward(self, x):
        self.on_pass("forward", self.index)
        return Backward.apply(self.linear(x), self.index, self.on_pass)


def blocks(on_pass, n: int = 8) -> torch.nn.Sequential:
    return torch.nn.Sequential(*(Block(i, on_pass) for i in range(n)))
