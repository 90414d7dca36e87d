"""Multi-turn test doubles: an environment that always answers, and a small chat policy to play it with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engines.hf import HFEngine
from environments.base import ChatMessage, Example, Scores
from environments.config import EpisodeLimits
from environments.episode import MultiTurnEnvironment
from tests.support.tiny_model import TinyModelSpec, save_tiny_model


class Counting(MultiTurnEnvironment):
    """Replies to every turn with what it read (``tool: I heard N``), until the turn limit ends the episode; the
    reward is the length of the last turn."""

    name = "counting"

    def __init__(self, heard: str = "heard", limits: EpisodeLimits | None = None) -> None:
        self.heard = heard
        if limits is not None:
            self.limits = limits

    def example(self, index: int) -> Example:
        return Example(index=index, prompt=(ChatMessage("user", f"count with me from {index}"),))

    def reply(self, example: Example, transcript: tuple[ChatMessage, ...]) -> tuple[ChatMessage, ...] | None:
        said = sum(len(m.content) for m in transcript if m.role == "assistant")
        return (ChatMessage("tool", f"{example.index} {self.heard} {said}"),)

    def score(self, example: Example, completion: str) -> Scores:
        return Scores.single("length", float(len(completion)))


class Drifting(Counting):
    """Keeps state between replies (how many it gave): an episode replayed later plays out differently."""

    name = "drifting"
    calls = 0

    def reply(self, example: Example, transcript: tuple[ChatMessage, ...]) -> tuple[ChatMessage, ...] | None:
        self.calls += 1
        return (ChatMessage("tool", f"reply number {self.calls}"),)


class Chatty(Counting):
    """Replies with more text than the run's episode limits allow."""

    name = "chatty"

    def reply(self, example: Example, transcript: tuple[ChatMessage, ...]) -> tuple[ChatMessage, ...] | None:
        return (ChatMessage("tool", "blah " * 1000),)


def chat_policy(directory: Path, seed: int = 3) -> tuple[HFEngine, Any]:
    """A random Qwen2 over a ChatML tokenizer trained here on :class:`Counting`'s words, saved in ``directory``:
    its HF engine and the tokenizer."""
    from transformers import AutoTokenizer

    from trainer.tokenizer import CHAT_TEMPLATE, save_hf_tokenizer, train_tokenizer

    corpus = [f"count with me from {i}; {i} heard {i * 7} tool assistant user" for i in range(300)]
    save_hf_tokenizer(train_tokenizer(corpus, 300), directory, 512, CHAT_TEMPLATE)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    save_tiny_model(directory, seed=seed, spec=TinyModelSpec(vocab_size=len(tokenizer)))
    return HFEngine(directory), tokenizer
