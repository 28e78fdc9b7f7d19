"""``uniun-runtime console``: open the running runtime's console in the default browser.

The console is the page the HTTP gateway serves at ``/`` (docs/console.md); its URL is
the gateway's base URL, which the gateway writes to ``$UNIUN_HOME/run/http.endpoint``
once it serves. Where there is no graphical browser to open (no display, ``--print``),
the URL is printed instead; it is printed in any case.
"""

from __future__ import annotations

import argparse
import os
import sys
import webbrowser
from pathlib import Path

from uniun.runtime.commands.common import fail
from uniun.runtime.config import ConfigError, RuntimeConfig, load_config
from uniun.runtime.state import EFFECTIVE_CONFIG, HTTP_ENDPOINT_FILE, is_running


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "console", help="open the console (chat beside a live view of the device) in a browser",
        description="Open the running runtime's console, the web page its HTTP gateway "
                    "serves at /, in the default browser; print its URL where no browser "
                    "can be opened.")
    parser.add_argument("--print", dest="print_only", action="store_true",
                        help="only print the URL")
    parser.add_argument("--config", type=Path, default=None, metavar="FILE",
                        help="configuration file (for its home)")
    parser.set_defaults(func=run)


def console_url(config: RuntimeConfig) -> str | None:
    """The console's URL while a runtime of this home serves it; else None."""
    if not is_running(config.run_dir):
        return None
    try:
        base = (config.run_dir / HTTP_ENDPOINT_FILE).read_text().strip()
    except OSError:
        return None
    return f"{base}/" if base else None


def graphical() -> bool:
    """Whether a browser window can be opened here (Python's webbrowser would otherwise
    start a text browser in this terminal, or nothing)."""
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
                or os.environ.get("BROWSER"))


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        effective = config.run_dir / EFFECTIVE_CONFIG
        if effective.exists():  # what the running runtime was started with
            config = load_config(effective)
    except ConfigError as err:
        fail(str(err))
        return 2
    if not config.http.enabled or not config.http.console:
        fail("this runtime serves no console ([http] enabled and [http] console are off)")
        return 1
    if not is_running(config.run_dir):
        fail(f"no runtime is running in {config.home}; start one with: uniun-runtime start")
        return 1
    url = console_url(config)
    if url is None:
        fail("the runtime's HTTP gateway does not serve yet (no run/http.endpoint); "
             "see uniun-runtime status")
        return 1
    print(url)
    if config.http.api_key:
        print("(this runtime has an API key: the page asks for it)", file=sys.stderr)
    if not args.print_only and graphical():
        try:
            webbrowser.open(url)
        except webbrowser.Error as err:
            fail(f"could not open a browser ({err}); open the URL above")
    return 0
