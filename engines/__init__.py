"""Inference backends behind one interface (base.Engine): vLLM and HF transformers; and the random Qwen2s they run."""
