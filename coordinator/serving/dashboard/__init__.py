"""The coordinator's live dashboard: ``/dashboard`` (page) and ``/v1/dashboard`` (its JSON)."""

from coordinator.serving.dashboard.routes import dashboard_router

__all__ = ["dashboard_router"]
