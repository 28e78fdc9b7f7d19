"""A headless Chromium for the console's bench and tests (Playwright for Python).

The browser is the system's (Debian's ``chromium`` package, or ``$UNIUN_CHROMIUM``):
Playwright drives it through ``executable_path`` and never downloads one, so nothing is
fetched at run time. :func:`why_no_browser` says, in words a skipped test can show, what
is missing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["ARGS", "CHROMIUM_ENV", "browser", "chromium_path", "why_no_browser"]

CHROMIUM_ENV = "UNIUN_CHROMIUM"  # a Chromium binary to use instead of the system's
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-sync"]


def chromium_path() -> str | None:
    given = os.environ.get(CHROMIUM_ENV)
    if given:
        return given if Path(given).is_file() else None
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None


def why_no_browser() -> str | None:
    """None when a browser can be driven here; else what is missing and how to get it."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return ("Playwright for Python is not installed (it is in the test extras: "
                "bin/setup, or pip install playwright)")
    given = os.environ.get(CHROMIUM_ENV)
    if given and chromium_path() is None:
        return f"{CHROMIUM_ENV}={given} is not a file"
    if chromium_path() is None:
        return ("no Chromium: bin/test installs Debian's chromium package with apt when it "
                f"runs as root; else apt-get install chromium, or set {CHROMIUM_ENV}")
    return None


@contextlib.contextmanager
def browser() -> Iterator[Any]:
    """A launched headless Chromium (a Playwright ``Browser``), closed afterwards."""
    from playwright.sync_api import sync_playwright

    path = chromium_path()
    if path is None:
        raise RuntimeError(why_no_browser() or "no Chromium")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=path, args=ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()
