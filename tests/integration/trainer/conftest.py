"""The trainer integration tests share the unit tests' one-thread fixture."""

from tests.unit.trainer.conftest import one_torch_thread

__all__ = ["one_torch_thread"]
