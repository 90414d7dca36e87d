"""TRL's ``GRPOTrainer`` on a prepared task: the reference side of :mod:`bench.learning_vs_trl`.

It runs in the benchmark's own venv (TRL pinned there, never in the project's), so it imports
nothing of this project: :mod:`bench.learning_vs_trl` writes a JSON spec holding the start
checkpoint, the training prompts exactly as the network's policy sees them (chat-templated text),
their reference answers, the end-token ids and the hyperparameters. The reward is the project's
exact-answer rule restated: the completion's first non-empty line, stripped, equals the answer,
and a completion that did not end on an end token earns 0 (the default truncation rule).

    .bench-venv-trl/bin/python bench/trl_grpo.py SPEC.json OUT_DIR

Writes ``OUT_DIR/policy`` (an HF checkpoint) and ``OUT_DIR/trl.json`` (per-step rewards, wall times).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    started = time.time()
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(spec["threads"])
    end_tokens = set(spec["eos_token_ids"])

    def exact_answer(
        completions: list[str], completion_ids: list[list[int]], answer: list[str], **_: Any
    ) -> list[float]:
        return [
            1.0 if ids and ids[-1] in end_tokens and first_line(text) == expected else 0.0
            for text, ids, expected in zip(completions, completion_ids, answer, strict=True)
        ]

    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    model.generation_config.eos_token_id = sorted(end_tokens)  # stop where the network's engines stop
    dataset = Dataset.from_dict({"prompt": spec["prompts"], "answer": spec["answers"]})
    config = GRPOConfig(
        output_dir=str(out / "trainer"),
        seed=spec["seed"],
        max_steps=spec["steps"],
        per_device_train_batch_size=spec["prompts_per_step"] * spec["group_size"],
        gradient_accumulation_steps=1,
        num_generations=spec["group_size"],
        max_completion_length=spec["max_tokens"],
        temperature=spec["temperature"],
        top_p=1.0,
        top_k=0,
        learning_rate=spec["lr"],
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        loss_type="dapo",
        scale_rewards="none",
        num_iterations=1,
        shuffle_dataset=False,
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    step_ends: list[float] = []

    class StepTimes(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            step_ends.append(time.time())

    # the network trainer's schedule: step s (from 0) at lr * min(1, (s + 1) / warmup_steps); transformers' own
    # warm-up would start at 0
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec["lr"], betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    warmup = max(1, spec["warmup_steps"])
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
    trainer = GRPOTrainer(
        model=model,
        optimizers=(optimizer, schedule),
        reward_funcs=exact_answer,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepTimes()],
    )
    train_started = time.time()
    trainer.train()
    trainer.save_model(str(out / "policy"))
    tokenizer.save_pretrained(str(out / "policy"))
    rewards = [round(float(entry["reward"]), 4) for entry in trainer.state.log_history if "reward" in entry]
    report = {
        "train_reward_per_step": rewards,
        "process_to_last_step_s": step_ends[-1] - started if step_ends else None,
        "train_to_last_step_s": step_ends[-1] - train_started if step_ends else None,
        "steps": len(step_ends),
    }
    (out / "trl.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
