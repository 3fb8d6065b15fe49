"""Headless Chromium (Debian's ``chromium`` + ``chromium-driver``) driven through Selenium."""

from __future__ import annotations

import shutil
from pathlib import Path

CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--window-size=1600,1000",
)
INSTALL_HINT = (
    "install the Debian packages chromium and chromium-driver (apt-get install chromium chromium-driver; .ci/run does)"
)


def missing_browser() -> str | None:
    """Why no browser can be started (None when chromium and chromedriver are installed)."""
    for name in ("chromium", "chromedriver"):
        if shutil.which(name) is None:
            return f"{name} is not on PATH: {INSTALL_HINT}"
    return None


def start_chromium(user_data_dir: Path, log_path: Path):
    """A headless Chromium with a fresh profile; Selenium talks to Debian's chromedriver (never
    Selenium Manager: nothing is downloaded)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = shutil.which("chromium")
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={user_data_dir}"):
        options.add_argument(flag)
    service = Service(executable_path=shutil.which("chromedriver"), log_output=str(log_path))
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(180)
    driver.set_script_timeout(60)
    return driver
