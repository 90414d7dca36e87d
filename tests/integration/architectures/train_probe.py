"""Two RL steps and an export for each of several models, in one process group (torchrun) or one process.

    torchrun --standalone --nproc-per-node 2 tests/integration/architectures/train_probe.py OUT_DIR MODEL_DIR...

For each model directory ``M`` (named by its architecture), rank 0 writes ``OUT_DIR/M.name/metrics.json``
(both steps' metrics and the world size) and the exported policy under ``OUT_DIR/M.name/policy``.
One process group for all models: a torchrun start costs more than a tiny model's two steps.
The steps are those of the FSDP2 probe (tests/integration/trainer/fsdp_probe.py), on the
reverse_text batch with made-up advantages and engine logprobs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tests.integration.trainer.fsdp_probe import LOSS, probe_batch, probe_section
from trainer.fsdp import DistInfo, init_distributed, shutdown
from trainer.train import Trainer


def train_and_export(model_dir: Path, out_dir: Path, info: DistInfo | None = None) -> list[dict[str, Any]]:
    trainer = Trainer(probe_section(model_dir, activation_checkpointing=True), num_steps=4, info=info)
    steps = [trainer.rl_step(probe_batch(trainer, seed), LOSS) for seed in (1, 2)]
    trainer.export(out_dir / "policy")
    if trainer.info.is_main:
        metrics = {"world_size": trainer.info.world_size, "steps": steps}
        (out_dir / "metrics.json").write_text(json.dumps(metrics))
    return steps


def main(out_root: Path, model_dirs: list[Path]) -> None:
    info = init_distributed()
    for model_dir in model_dirs:
        out_dir = out_root / model_dir.name
        out_dir.mkdir(parents=True, exist_ok=True)
        train_and_export(model_dir, out_dir, info)
    shutdown(info)


if __name__ == "__main__":
    main(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]])
