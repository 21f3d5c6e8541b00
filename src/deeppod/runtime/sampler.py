"""An elastic distributed sampler: finishes an interrupted epoch on any number of workers
with no sample seen twice and none skipped.

Every epoch is one permutation of the dataset (seeded by ``seed`` and the epoch), the same
on every worker. ``position`` counts the samples of it the whole job has consumed. The
rest is dealt round-robin: worker r of M takes ``rest[r::M]``. Because all workers step
together, after k steps of b samples each the consumed samples are exactly the first
k*b*M of ``rest``; so the position is a single number that a checkpoint can carry from
N workers to M. The last steps may be uneven across workers (at most one sample apart):
use DDP's ``join()`` context, as the built-in trainer does.
"""

from __future__ import annotations

import os


class ElasticSampler:
    def __init__(self, num_samples: int, *, rank: int | None = None, world_size: int | None = None,
                 seed: int = 0, shuffle: bool = True):
        self.n = num_samples
        self.rank = int(os.environ.get("RANK", 0)) if rank is None else rank
        self.world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in 0..{self.world_size - 1}")
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.n))
        import torch

        g = torch.Generator()
        g.manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def rest(self) -> list[int]:
        return self._order()[self.position:][self.rank::self.world_size]

    def __iter__(self):
        return iter(self.rest())

    def __len__(self) -> int:
        left = self.n - self.position
        return max(0, (left - self.rank + self.world_size - 1) // self.world_size)

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning (unless a checkpoint put us inside it)."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.position = 0

    def advance(self, local_batch: int) -> None:
        """Record one step in which every worker consumed ``local_batch`` samples."""
        self.position = min(self.n, self.position + local_batch * self.world_size)

    @property
    def epoch_done(self) -> bool:
        return self.position >= self.n

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "n": self.n}

    def load_state_dict(self, state: dict) -> None:
        if state["n"] != self.n:
            raise ValueError(f"the checkpoint's sampler covered {state['n']} samples, this dataset has {self.n}")
        self.epoch, self.position, self.seed = state["epoch"], state["position"], state["seed"]
