"""The coordinator's /dashboard in a real browser, on a real run.

A coordinator serving the built-in reverse_text task, one `prime-worker join --engine hf` and a
real `prime-validator run` produce verdicts with recomputed rewards; then Debian's headless
Chromium, driven by Selenium through /usr/bin/chromedriver (nothing is downloaded), loads
/dashboard and must show the live worker and one reward-chart point per rewarded verdict,
each labelled with that verdict's mean reward. In CI (CI=true) a missing browser fails the
test; .ci/run installs it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from coordinator.dashboard.history import MAX_REWARD_POINTS
from protocol.identity import load_or_create_identity
from tests.integration.network import Network, running_network
from tests.integration.shardcast_nodes import wait_until
from trainer.builtin import resolve_model_path

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
MIN_REWARDED_VERDICTS = 2


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.is_file()]
    if missing:
        message = f"{' and '.join(missing)} missing: apt-get install chromium chromium-driver"
        if os.environ.get("CI"):
            pytest.fail(f"CI=true: {message}")
        pytest.skip(message)
    options = Options()
    options.binary_location = str(CHROMIUM)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # console errors, CSP violations
    for arg in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1900",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-extensions",
    ):
        options.add_argument(arg)
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    try:
        yield driver
    finally:
        driver.quit()


def rewarded_verdicts(net: Network) -> dict[str, dict[str, Any]]:
    return {e["subject"]: e["data"] for e in net.events("verdict") if e["data"]["rewards"]}


def text_of(browser: WebDriver, selector: str) -> str | None:
    """The rendered text of the first element ``selector`` matches, or None when none does."""
    script = "const e = document.querySelector(arguments[0]); return e && e.textContent;"
    found = browser.execute_script(script, selector)
    return None if found is None else str(found)


def cells_of(browser: WebDriver, row_selector: str) -> list[str]:
    """The texts of the cells of the first table row ``row_selector`` matches ([] when none does)."""
    found = browser.execute_script(
        "const row = document.querySelector(arguments[0]); return row ? [...row.cells].map((c) => c.textContent) : [];",
        row_selector,
    )
    return [str(cell) for cell in found]


def verdict_rows(browser: WebDriver) -> list[list[str]]:
    """The cell texts of every row of the recent-verdicts table."""
    found = browser.execute_script(
        "return [...document.querySelectorAll('#verdicts tr[data-submission-id]')]"
        ".map((row) => [...row.cells].map((c) => c.textContent));"
    )
    return [[str(cell) for cell in row] for row in found]


def reward_points(browser: WebDriver) -> dict[str, str]:
    """Submission id -> tooltip of each point of the reward chart."""
    found = browser.execute_script(
        "return [...document.querySelectorAll('#reward-chart circle.point')]"
        ".map((c) => [c.dataset.submissionId, c.querySelector('title').textContent]);"
    )
    return {str(submission_id): str(title) for submission_id, title in found}


def test_dashboard_shows_the_live_worker_and_the_runs_rewards(tmp_path: Path, browser: WebDriver) -> None:
    start = resolve_model_path("builtin:tiny-qwen2-reverse-start")
    builtin_tasks = "coordinator.builtin_tasks:BuiltinTasks"
    with running_network(tmp_path, [start], task="reverse_text", task_source=builtin_tasks) as net:
        worker = net.start_worker("worker-hf", "hf", [])
        validator = net.start_validator()
        worker_id = load_or_create_identity(net.root / "worker-hf").node_id
        wait_until(
            lambda: len(rewarded_verdicts(net)) >= MIN_REWARDED_VERDICTS,
            300,
            f"{MIN_REWARDED_VERDICTS} verdicts with rewards (worker log:\n{net.worker_log('worker-hf')})",
        )
        assert worker.poll() is None, net.worker_log("worker-hf")
        assert validator.poll() is None, net.worker_log("validator")

        browser.get(f"{net.url}/dashboard")
        # The page redraws every 2 s: read each thing in one script call, never through stale element handles.
        row_selector = f'#workers tr[data-node-id="{worker_id}"]'
        # Shown once registered; the version it holds once a heartbeat (every 10 s) has reported it.
        WebDriverWait(browser, 30).until(lambda _d: cells_of(browser, row_selector)[2:3] == ["v0"])
        node_id, engine, policy, held, *_counts, state = cells_of(browser, row_selector)
        assert (node_id, engine, policy, held, state) == (worker_id, "hf", "v0", "v0", "live")

        # Every rewarded verdict so far (up to the chart's last MAX_REWARD_POINTS) must appear as a chart point.
        expected = dict(list(rewarded_verdicts(net).items())[-MAX_REWARD_POINTS:])
        WebDriverWait(browser, 30).until(lambda _d: set(expected) <= set(reward_points(browser)))
        points = reward_points(browser)
        for submission_id, data in expected.items():
            mean = sum(data["rewards"]) / len(data["rewards"])
            assert f"mean reward {mean:.3f} over {len(data['rewards'])} rollouts" in points[submission_id]
        assert set(points) <= set(rewarded_verdicts(net))  # nothing the run did not produce
        assert text_of(browser, "#reward-chart polyline.series-line") is not None  # the moving mean
        assert text_of(browser, "#throughput-chart polyline") is not None
        shown = verdict_rows(browser)
        verdicts = {e["subject"]: e["data"] for e in net.events("verdict")}
        assert shown and all(verdicts[row[1]]["accepted"] == (row[5] == "accepted") for row in shown), shown[:3]
        assert text_of(browser, "#stat-workers") == "1"
        logged = browser.get_log("browser")  # type: ignore[no-untyped-call]
        assert [entry for entry in logged if entry["level"] == "SEVERE"] == []  # no script error, no CSP violation
        screenshot = tmp_path / "dashboard.png"
        assert browser.save_screenshot(str(screenshot)), "no screenshot"
        print(f"dashboard screenshot: {screenshot}")
