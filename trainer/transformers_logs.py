"""transformers set up for our logs: no per-file progress bars (our logs carry one line per event)."""

from __future__ import annotations


def quiet_transformers() -> None:
    """Turn off transformers' progress bars (loading a checkpoint would draw one per file)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
