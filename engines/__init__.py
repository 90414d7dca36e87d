"""Inference backends behind one interface (base.Engine): vLLM and HF transformers."""
