"""The trainer integration tests share the unit tests' fixtures (one torch thread, the tiny built-in model)."""

from tests.unit.trainer.conftest import builtin_dir, one_torch_thread, tiny_model_dir

__all__ = ["builtin_dir", "one_torch_thread", "tiny_model_dir"]
