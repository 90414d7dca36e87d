"""The policies that sampled a step's tokens, kept by the trainer to recompute their log-probabilities.

With ``loss.behaviour_logprobs = "recompute"`` the importance ratio's denominator is never a number a worker
declared: the trainer computes each trained token's log-probability itself, with the weights of the policy
version that sampled it. A step's batch holds samples of the last ``async_level + 1`` versions, and the trainer
published every one of them, so it keeps a copy of its trained parameters (a LoRA run's adapters; each rank its
own shards) after each version it publishes: :meth:`BehaviourPolicies.remember`. To compute under version ``v``,
:meth:`BehaviourPolicies.swapped` copies ``v``'s parameters into the model and, after, the current version's
back, bit for bit, so training goes on from exactly where it was. Samples of the version being trained need no
copy: their behaviour log-probabilities are the training forward's own, detached.

The copies go into the trainer's checkpoint (:mod:`trainer.checkpoint`), so a resumed trainer recomputes exactly
what it would have without the crash.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


class BehaviourPolicies:
    """Copies of ``params`` (the model's trained parameters) by policy version; the newest ``keep`` are kept."""

    def __init__(self, params: list[nn.Parameter], keep: int) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, not {keep}")
        self.params = params
        self.keep = keep
        self._copies: dict[int, list[torch.Tensor]] = {}

    @property
    def versions(self) -> list[int]:
        return sorted(self._copies)

    @property
    def current(self) -> int | None:
        """The newest version remembered (what the model holds between steps)."""
        return max(self._copies) if self._copies else None

    def __contains__(self, version: object) -> bool:
        return version in self._copies

    @torch.no_grad()
    def remember(self, version: int) -> None:
        """Keep the model's parameters now as ``version``; versions older than the newest ``keep`` are dropped.
        A version whose weights equal the previous one's (a skipped step) still costs a copy: copies are never
        shared, so nothing written into one can reach another."""
        self._copies[version] = [p.detach().clone() for p in self.params]
        for old in sorted(self._copies)[: max(0, len(self._copies) - self.keep)]:
            del self._copies[old]

    def forget(self) -> None:
        """Drop every copy (a restore replaces the weights every remembered version described)."""
        self._copies.clear()

    @torch.no_grad()
    def _load(self, version: int) -> None:
        for param, copy in zip(self.params, self._copies[version], strict=True):
            param.copy_(copy)

    def reload_current(self) -> None:
        """Put the current version's parameters back into the model (after loading others into it)."""
        current = self.current
        if current is None:
            raise KeyError("no policy version is kept")
        self._load(current)

    @contextmanager
    def swapped(self, version: int) -> Iterator[None]:
        """The model holds ``version``'s parameters inside the block, and the current version's again after it."""
        current = self.current
        if current is None or version not in self._copies:
            raise KeyError(f"policy version {version} is not kept (kept: {self.versions})")
        if version == current:
            yield
            return
        self._load(version)
        try:
            yield
        finally:
            self._load(current)
