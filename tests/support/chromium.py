"""Debian's headless Chromium driven by Selenium, and what the dashboard tests and its screenshot ask of a page.

The browser is /usr/bin/chromium through /usr/bin/chromedriver (`apt-get install chromium
chromium-driver`); Selenium is never let download one. :func:`panel_overlaps` measures what a
person sees of each ``.panel`` of the page (the panel's box and everything drawn inside it, so a
table spilling out of its column counts) and returns the pairs that intersect.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
INSTALL_HINT = "apt-get install chromium chromium-driver"

# Each panel's drawn extent: the union of its box and its descendants' (zero-size ones left out).
_EXTENTS = """
return [...document.querySelectorAll('.panel')].map((panel, index) => {
  let [left, top, right, bottom] = [Infinity, Infinity, -Infinity, -Infinity];
  for (const node of [panel, ...panel.querySelectorAll('*')]) {
    const r = node.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;
    [left, top, right, bottom] = [Math.min(left, r.left), Math.min(top, r.top),
      Math.max(right, r.right), Math.max(bottom, r.bottom)];
  }
  const name = panel.id || (panel.querySelector('h2, figcaption, .label, table') || panel).textContent.trim();
  return { index, name: name.slice(0, 40), left, top, right, bottom };
});
"""


def missing_browser() -> list[str]:
    return [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.is_file()]


def headless_chromium(profile_dir: Path, log_path: Path, width: int = 1400, height: int = 1900) -> WebDriver:
    """A headless Chromium window of ``width`` x ``height`` CSS pixels, its console log kept (SEVERE = an error)."""
    options = Options()
    options.binary_location = str(CHROMIUM)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # console errors, CSP violations
    for arg in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        f"--window-size={width},{height}",
        f"--user-data-dir={profile_dir}",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-extensions",
    ):
        options.add_argument(arg)
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(log_path))
    return webdriver.Chrome(service=service, options=options)


def set_viewport(browser: WebDriver, width: int, height: int) -> None:
    """Make the page's viewport (not the window around it) ``width`` x ``height`` CSS pixels."""
    browser.set_window_size(width, height)
    inner = browser.execute_script("return [window.innerWidth, window.innerHeight];")
    browser.set_window_size(2 * width - int(inner[0]), 2 * height - int(inner[1]))


def panel_extents(browser: WebDriver) -> list[dict[str, Any]]:
    return list(browser.execute_script(_EXTENTS))


def panel_overlaps(browser: WebDriver, tolerance_px: float = 0.5) -> list[tuple[str, str]]:
    """Names of the pairs of ``.panel`` elements whose drawn extents intersect (by more than ``tolerance_px``)."""
    extents = panel_extents(browser)
    found = []
    for i, a in enumerate(extents):
        for b in extents[i + 1 :]:
            width = min(a["right"], b["right"]) - max(a["left"], b["left"])
            height = min(a["bottom"], b["bottom"]) - max(a["top"], b["top"])
            if width > tolerance_px and height > tolerance_px:
                found.append((a["name"], b["name"]))
    return found


def screenshot(browser: WebDriver, path: Path, width: int, height: int | None = None) -> None:
    """A PNG of the page at ``width`` CSS pixels: its top ``height`` pixels, or the whole page when None."""
    if height is None:
        height = int(browser.execute_script("return document.documentElement.scrollHeight;"))
    set_viewport(browser, width, height)
    if not browser.save_screenshot(str(path)):
        raise RuntimeError(f"Chromium saved no screenshot to {path}")
