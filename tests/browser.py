"""Headless Chromium for the viewer tests (Debian's ``chromium`` + ``chromium-driver``,
driven through selenium; ``make test`` installs them when run as root).

``browser_or_skip_reason()`` says why no browser can run here; ``chromium()`` is a context
manager giving a selenium WebDriver on a fresh profile directory.
"""
from __future__ import annotations

import contextlib
import shutil
import tempfile
from typing import Iterator, Optional

CHROMIUM_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--window-size=1600,1000")


def _binary(*names: str) -> Optional[str]:
    for n in names:
        p = shutil.which(n)
        if p:
            return p
    return None


def browser_or_skip_reason() -> Optional[str]:
    """None when a test can drive Chromium here, else why not."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    if _binary("chromium", "chromium-browser") is None:
        return "Debian's chromium is not installed (make test installs it when run as root)"
    if _binary("chromedriver") is None:
        return "chromium-driver is not installed (make test installs it when run as root)"
    return None


@contextlib.contextmanager
def chromium() -> Iterator["object"]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    profile = tempfile.mkdtemp(prefix="hlotk-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = _binary("chromium", "chromium-browser")
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    # An explicit driver path: selenium never tries to download one.
    driver = webdriver.Chrome(service=Service(executable_path=_binary("chromedriver")),
                              options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_ready(driver, timeout: float = 30.0) -> dict:
    """Wait until the viewer has painted; returns its ``hlotkTiming`` (ms)."""
    from selenium.webdriver.support.ui import WebDriverWait
    WebDriverWait(driver, timeout).until(
        lambda d: d.execute_script("return document.body.dataset.ready"))
    state = driver.execute_script("return document.body.dataset.ready")
    if state != "1":
        raise AssertionError("viewer failed: " + driver.find_element("id", "main").text)
    return driver.execute_script("return window.hlotkTiming")
