"""The trainer: HF and built-in models, FSDP2, the GRPO and SFT losses, LoRA, checkpoints and exact resume."""
