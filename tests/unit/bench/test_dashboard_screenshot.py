"""The dashboard screenshot script: refuses without a browser, and takes its defaults from the repository."""

from __future__ import annotations

import pytest

from bench import dashboard_screenshot
from bench.record import ROOT


def test_without_chromium_it_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(dashboard_screenshot, "missing_browser", lambda: ["/usr/bin/chromium"])
    assert dashboard_screenshot.main([]) == 2
    assert "apt-get install chromium chromium-driver" in capsys.readouterr().err


def test_the_image_it_refreshes_is_the_one_the_docs_show() -> None:
    shown = (ROOT / "docs" / "operator.md").read_text()
    assert "images/dashboard.png" in shown and (ROOT / "docs" / "images" / "dashboard.png").is_file()
    assert "python -m bench.dashboard_screenshot" in shown
