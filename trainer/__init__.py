"""The trainer: HF model loading, FSDP2, GRPO and SFT losses, checkpoints, eval, built-in model and tasks."""
