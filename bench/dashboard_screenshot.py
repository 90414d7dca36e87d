"""Re-take docs/images/dashboard.png: headless Chromium on the dashboard of a real demo run.

Starts ``prime-coordinator start -c configs/demo.toml`` (or ``--config``) in a scratch data dir on a
free port, with ``orchestrator.num_steps`` set to ``--num-steps`` and the coordinator kept up once
they are done; waits until ``--at-step`` steps are published; then loads /dashboard in Debian's
headless Chromium (the driver the dashboard tests use, :mod:`tests.support.chromium`), lets it
redraw, and saves the top ``--height`` pixels of the page (0: all of it), ``--width`` CSS pixels
wide. Only the coordinator this started is stopped, by its PID. The last line printed is the
caption docs/operator.md carries under the image (date, commit, hardware, the command):

    python -m bench.dashboard_screenshot --num-steps 40 --at-step 30
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.record import ROOT, describe_hardware, short_commit
from protocol import routes
from protocol.schemas import RunStatus
from runtime.ports import free_port
from tests.support.chromium import INSTALL_HINT, headless_chromium, missing_browser, screenshot, set_viewport
from tests.support.coordinator_process import CoordinatorProcess

REDRAW_S = 6.0
"""Time for the page to poll /v1/dashboard a few times (every 2 s) and draw at its final size."""


def published_steps(url: str) -> int | None:
    try:
        return RunStatus.model_validate_json(httpx.get(f"{url}{routes.STATUS}", timeout=5).content).num_train_steps_done
    except (httpx.TransportError, ValueError):
        return None


def take(config: Path, out: Path, num_steps: int, at_step: int, size: tuple[int, int | None], timeout_s: float) -> str:
    """Run the demo, screenshot its dashboard at ``at_step`` into ``out``; the caption line."""
    width, height = size
    scratch = Path(tempfile.mkdtemp(prefix="dashboard-shot-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    sets = [
        f"data_dir='{scratch / 'run'}'",
        f"api.port={port}",
        f"orchestrator.num_steps={num_steps}",
        "orchestrator.exit_when_done=false",
    ]
    args = tuple(arg for value in sets for arg in ("--set", value))
    coordinator = CoordinatorProcess(config, scratch / "coordinator.log", {"PYTHONPATH": str(ROOT)})
    print(f"starting the demo ({config}, {num_steps} steps) in {scratch}; log {coordinator.log_path}", file=sys.stderr)
    coordinator.start(url, args, timeout_s=600)
    try:
        deadline = time.monotonic() + timeout_s
        while (published_steps(url) or 0) < at_step:
            if coordinator.proc is not None and coordinator.proc.poll() is not None:
                raise RuntimeError(f"the coordinator exited:\n{coordinator.log_path.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"fewer than {at_step} steps published after {timeout_s:.0f} s")
            time.sleep(5)
        browser = headless_chromium(scratch / "chromium-profile", scratch / "chromedriver.log", width, 1200)
        try:
            set_viewport(browser, width, 1200)
            browser.get(f"{url}/dashboard")
            time.sleep(REDRAW_S)
            shown = browser.execute_script("return document.getElementById('stat-steps-done').textContent;")
            screenshot(browser, out, width, height)
        finally:
            browser.quit()
    finally:
        coordinator.stop()
    where = "the whole page" if height is None else f"the top {height} px of the page"
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    command = f"prime-coordinator start -c {config.relative_to(ROOT) if config.is_relative_to(ROOT) else config}"
    overrides = " ".join(f"--set {shlex.quote(value)}" for value in sets[2:3])
    return (
        f"A demo run of `{command} {overrides}` after {shown} steps ({date}, commit {short_commit()}, "
        f"{describe_hardware()}; headless Chromium, {width} px wide, {where})."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "demo.toml", help="The run's config.")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "dashboard.png", help="PNG to write.")
    parser.add_argument("--num-steps", type=int, default=40, help="orchestrator.num_steps of the run.")
    parser.add_argument("--at-step", type=int, default=30, help="Take the screenshot once this many steps are done.")
    parser.add_argument("--width", type=int, default=1600, help="Page width in CSS pixels.")
    parser.add_argument("--height", type=int, default=1900, help="Pixels from the top of the page (0: all of it).")
    parser.add_argument("--timeout-s", type=float, default=7200.0, help="Give up after this long.")
    args = parser.parse_args(argv)
    missing = missing_browser()
    if missing:
        print(f"{' and '.join(missing)} missing: {INSTALL_HINT}", file=sys.stderr)
        return 2
    size = (args.width, args.height or None)
    caption = take(args.config.resolve(), args.out.resolve(), args.num_steps, args.at_step, size, args.timeout_s)
    print(f"dashboard screenshot: {args.out}", file=sys.stderr)
    print(caption)
    return 0


if __name__ == "__main__":
    sys.exit(main())
