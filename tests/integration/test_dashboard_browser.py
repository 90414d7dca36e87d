"""The coordinator's /dashboard in a real browser, on real runs.

A coordinator serving the built-in reverse_text task, one `prime-worker join --engine hf` and a
real `prime-validator run` produce verdicts with recomputed rewards, while a real `prime-relay`
mirrors the coordinator's origin and announces itself on gossip; then Debian's headless
Chromium, driven by Selenium through /usr/bin/chromedriver (nothing is downloaded), loads
/dashboard and must show the live worker, one reward-chart point per rewarded verdict (each
labelled with that verdict's mean reward), and the relay answering with v0, counted as a
holder of v0. A second relay, announced by a gossip peer of the test's own with a URL full of
markup and a port nothing listens on, must show as unreachable, its URL as plain text. This run
has no orchestrator, so the step charts must say there are no training steps yet.

A second test opens the page late in a short training run (`prime-coordinator start` with its
orchestrator and local network): the tokens/s chart must reach back before the page was opened
(it is drawn from the ledger's history, not from what the page saw), and the live worker count,
the step time and the ETA must be shown. On both runs, at 1280 and 1920 px wide, no two panels
(tiles, charts, tables) may overlap: each panel's extent is its box and everything drawn inside
it. In CI (CI=true) a missing browser fails the tests; .ci/run installs it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from coordinator.serving.dashboard.history import MAX_REWARD_POINTS
from protocol import routes
from protocol.identity import NodeIdentity, load_or_create_identity
from protocol.schemas import P2PInfo, RelayAnnouncement, RunStatus
from runtime.p2p.config import P2PConfig
from runtime.p2p.gossip import Gossip
from runtime.ports import free_port
from tests.support.chromium import INSTALL_HINT, headless_chromium, missing_browser, panel_overlaps, set_viewport
from tests.support.coordinator_process import CoordinatorProcess
from tests.support.network import Network, running_network, tiny_policy
from tests.support.requirements import missing
from tests.support.run_configs import write_small_run
from tests.support.shardcast_nodes import wait_until
from trainer.resolve import resolve_model_path

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
MIN_REWARDED_VERDICTS = 2
TRAINING_STEPS = 500
"""More than the test waits for: the run is still training (and its ETA a time) when the page is checked."""
LAYOUT_WIDTHS = (1280, 1920)
DURATION = r"\d+h\d\dm|\d+m\d\ds|\d+s"
"""How the page (and `prime-coordinator status`) writes the time left."""


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    absent = missing_browser()
    if absent:
        message = f"{' and '.join(absent)} missing: {INSTALL_HINT}"
        missing(f"CI=true: {message}", message)
    driver = headless_chromium(tmp_path / "chromium-profile", tmp_path / "chromedriver.log")
    try:
        yield driver
    finally:
        driver.quit()


@contextmanager
def gossip_peer(net: Network) -> Iterator[Gossip]:
    """A gossip node of the test's own, joined to the coordinator's network."""
    peer = Gossip(NodeIdentity.generate(), P2PConfig(), net.coordinator_id)
    peer.start()
    try:
        peer.join(P2PInfo.model_validate_json(httpx.get(f"{net.url}{routes.P2P}", timeout=5).content))
        yield peer
    finally:
        peer.stop()


def announce_until_heard(net: Network, peer: Gossip, url: str, timeout_s: float = 30.0) -> None:
    """Announce a relay at ``url`` (again, while the gossip mesh forms) until the coordinator lists it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        peer.announce(RelayAnnouncement(url=url))
        relays = httpx.get(f"{net.url}/v1/dashboard", timeout=5).json()["relays"]
        if any(relay["url"] == url for relay in relays):
            return
        time.sleep(1.0)
    raise AssertionError(f"the coordinator never listed the relay announced at {url}")


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
    with running_network(tmp_path, [start]) as net:
        relay_url, _relay = net.relays.relay([f"{net.url}/shardcast"], net.coordinator_id)
        hostile_url = f"http://127.0.0.1:{free_port()}/<img/src=x/onerror=alert(1)><b>relay</b>"
        with gossip_peer(net) as peer:
            announce_until_heard(net, peer, hostile_url)
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
        verdicts = net.verdicts()
        assert shown and all(verdicts[row[1]]["accepted"] == (row[5] == "accepted") for row in shown), shown[:3]
        assert text_of(browser, "#stat-workers") == "1"

        # The relay: heard on gossip (it re-announces every 30 s), then asked for its versions.
        relay_row = f'#relays tr[data-relay-url="{relay_url}"]'
        WebDriverWait(browser, 90).until(lambda _d: cells_of(browser, relay_row)[1:2] == ["v0"])
        url, held, _mirroring, last_answer, relay_state = cells_of(browser, relay_row)
        assert (url, held, relay_state) == (relay_url, "v0", "answering") and last_answer.endswith("ago")
        WebDriverWait(browser, 10).until(lambda _d: text_of(browser, '#versions tr[data-version="0"] .relay-holders'))
        assert text_of(browser, '#versions tr[data-version="0"] .relay-holders') == " 1 of 1"
        hostile_row = cells_of(browser, f"#relays tr[data-relay-url='{hostile_url}']")
        assert hostile_row[0] == hostile_url and hostile_row[1] == "-" and hostile_row[3] == "never", hostile_row
        assert hostile_row[4].startswith("unreachable"), hostile_row
        assert text_of(browser, "#relays img, #relays b") is None  # shown as text, never parsed as markup
        assert text_of(browser, "#stat-relays") == "1 of 2"
        assert text_of(browser, "#step-chart text.no-data") == "no training steps yet"
        for chart in ("length", "finish", "loss", "entropy", "kl"):
            assert text_of(browser, f"#{chart}-chart text.no-data") == "no training steps yet"
        assert text_of(browser, "#component-chart text.no-data") == "no named rewards yet"
        assert text_of(browser, "#eval-chart text.no-data") == "no eval yet (orchestrator.eval_every_steps)"
        assert text_of(browser, "#stat-steps-done") == "-"
        assert text_of(browser, "#stat-eta") == "-"  # no RL loop: no ETA
        for width in LAYOUT_WIDTHS:  # every table holds rows now: none may spill over another panel
            set_viewport(browser, width, 1200)
            time.sleep(2.5)
            assert panel_overlaps(browser) == [], f"panels overlap at {width} px"
        logged = browser.get_log("browser")  # type: ignore[no-untyped-call]
        assert [entry for entry in logged if entry["level"] == "SEVERE"] == []  # no script error, no CSP violation
        screenshot = tmp_path / "dashboard.png"
        assert browser.save_screenshot(str(screenshot)), "no screenshot"
        print(f"dashboard screenshot: {screenshot}")


def training_config(root: Path, port: int) -> Path:
    """A short RL run on a local network (one HF worker, one validator, a relay, the torchrun trainer)."""
    start = tiny_policy(root / "start", seed=7)
    return write_small_run(root, port, "dashboard-history-test", start, TRAINING_STEPS)


def run_status(url: str) -> RunStatus | None:
    try:
        return RunStatus.model_validate_json(httpx.get(f"{url}{routes.STATUS}", timeout=5).content)
    except (httpx.TransportError, ValueError):
        return None


def tokens_chart_times(browser: WebDriver) -> list[float]:
    """The time (Unix seconds) of each point of the generation tokens/s chart."""
    found = browser.execute_script(
        "return [...document.querySelectorAll('#tokens-chart circle.point')].map((c) => Number(c.dataset.at));"
    )
    return [float(at) for at in found]


def test_a_page_opened_late_shows_the_whole_training_run(tmp_path: Path, browser: WebDriver) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    coordinator = CoordinatorProcess(
        training_config(tmp_path, port), tmp_path / "coordinator.log", {"PYTHONPATH": str(REPO_ROOT)}
    )
    coordinator.start(url, timeout_s=300)
    try:
        # Opened once two steps are published: the step time is known and most of the run is still to come.
        wait_until(
            lambda: (status := run_status(url)) is not None and status.num_train_steps_done >= 2,
            900,
            f"two published steps (coordinator log:\n{coordinator.log_path.read_text()[-3000:]})",
        )
        opened_at = time.time()
        browser.get(f"{url}/dashboard")
        WebDriverWait(browser, 30).until(lambda _d: re.fullmatch(DURATION, text_of(browser, "#stat-eta") or ""))
        assert text_of(browser, "#stat-workers") == "1"
        assert re.fullmatch(r"\d+\.\d s", text_of(browser, "#stat-step-time") or ""), text_of(
            browser, "#stat-step-time"
        )
        eta = text_of(browser, "#stat-eta")

        # The tokens/s chart is the run's history, from the ledger: it starts long before the page was opened.
        times = tokens_chart_times(browser)
        assert len([at for at in times if at < opened_at]) >= 2, (times, opened_at)
        assert text_of(browser, "#step-chart circle.point") is not None  # the steps trained before the page
        for chart in ("loss", "entropy", "kl"):  # the trainer's own figures per step
            assert text_of(browser, f"#{chart}-chart circle.point") is not None, chart

        for width in LAYOUT_WIDTHS:
            set_viewport(browser, width, 1200)
            time.sleep(2.5)  # a redraw at this width
            assert panel_overlaps(browser) == [], f"panels overlap at {width} px (ETA was {eta})"
        logged = browser.get_log("browser")  # type: ignore[no-untyped-call]
        assert [entry for entry in logged if entry["level"] == "SEVERE"] == []
    finally:
        coordinator.stop()
