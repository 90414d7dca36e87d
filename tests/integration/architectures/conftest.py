"""The architecture matrix's shared models and ledger plumbing: two tiny checkpoints per architecture, built once.

Every architecture of :data:`tests.support.tiny_model.ARCHITECTURES` gets two random inits of the
same shape (seeds 0 and 1: "the policy" and "another policy version" to reload), at a shape every
engine runs: hidden 64, two heads of 32 (vLLM's CPU attention needs head sizes of 32 and up), one
KV head, two layers, a 1024-token vocabulary.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from protocol.schemas import PendingSubmission, Task
from tests.support.adversary import sample_tasks_of, signed_pending, submission_of
from tests.support.tiny_model import ARCHITECTURES, TINY_EOS_TOKEN_ID, TinyModelSpec, save_tiny_model
from toploc.verify import Claim, SampleTask

EOS = (TINY_EOS_TOKEN_ID,)
SEED = 4242
PROMPTS = [[5, 9, 33, 12], [7, 7, 7, 8, 100], [300, 2, 17], [64, 65, 66, 67, 68, 69, 70, 71, 72]]
GROUP_SIZE = 2
MAX_TOKENS = 40


def matrix_spec(architecture: str) -> TinyModelSpec:
    if architecture not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {architecture!r}")
    return TinyModelSpec(
        architecture=architecture,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
    )


@pytest.fixture(scope="session")
def matrix_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Architecture -> (seed-0 checkpoint, seed-1 checkpoint)."""
    root = tmp_path_factory.mktemp("architectures")
    return {
        arch: (
            save_tiny_model(root / arch / "a", seed=0, spec=matrix_spec(arch)),
            save_tiny_model(root / arch / "b", seed=1, spec=matrix_spec(arch)),
        )
        for arch in ARCHITECTURES
    }


def ledger_task(temperature: float = 1.0) -> Task:
    return Task.model_validate(
        {
            "task_id": "t-1",
            "lease_id": "l-1",
            "task_name": "matrix",
            "prompts": [{"prompt_index": i, "token_ids": p} for i, p in enumerate(PROMPTS)],
            "group_size": GROUP_SIZE,
            "sampling": {"temperature": temperature, "max_tokens": MAX_TOKENS},
            "policy_version": 1,
            "sampling_seed": SEED,
            "deadline": time.time() + 600,
        }
    )


def sample_tasks(task: Task) -> list[SampleTask]:
    return sample_tasks_of(task, EOS)


def pending(task: Task, claims: Sequence[Claim], engine: str = "hf") -> PendingSubmission:
    """A signed submission of ``claims`` for ``task``, as the ledger hands it to a validator."""
    return signed_pending(task, submission_of(task, claims, "vllm" if engine == "vllm" else "hf"))


@pytest.fixture(scope="session")
def trainer_starts(
    matrix_models: dict[str, tuple[Path, Path]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """Architecture -> a trainer start checkpoint: the seed-0 model with the built-in tokenizer beside it."""
    import shutil

    from trainer.builtin import builtin_tokenizer
    from trainer.tokenizer import save_hf_tokenizer

    root = tmp_path_factory.mktemp("trainer-starts")
    tokenizer = builtin_tokenizer()
    starts = {}
    for arch, (policy, _other) in matrix_models.items():
        start = root / arch
        shutil.copytree(policy, start)
        save_hf_tokenizer(tokenizer, start, matrix_spec(arch).max_position_embeddings)
        starts[arch] = start
    return starts


@pytest.fixture(scope="session")
def trained_policies(trainer_starts: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Architecture -> the output of two FSDP2 RL steps on 2 ranks (torchrun, gloo): metrics.json and policy/."""
    import os
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("trained")
    probe = Path(__file__).with_name("train_probe.py")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(probe)]
    # The probe imports tests.*: the repository goes on its path, as pytest's rootdir is on ours.
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [*command, str(out), *map(str, trainer_starts.values())], capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {arch: out / start.name for arch, start in trainer_starts.items()}
