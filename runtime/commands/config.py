"""``uniun-runtime config``: print the effective configuration, or the documented defaults."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from uniun.runtime.config import ConfigError, load_config, load_config_text
from uniun.runtime.config_toml import dump_config, reference_markdown


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "config", help="print the effective configuration (every key, with its doc)",
        description="Print the configuration the runtime would run with: the file (--config, "
                    "else $UNIUN_CONFIG, else $UNIUN_HOME/uniun.toml if present) over the "
                    "defaults. --example prints the defaults as a portable, commented file "
                    "(that is examples/uniun.toml).")
    parser.add_argument("--config", type=Path, default=None, metavar="FILE",
                        help="configuration file to read")
    parser.add_argument("--example", action="store_true",
                        help="print the commented defaults (portable: no home paths)")
    parser.add_argument("--bare", action="store_true", help="leave out the comments")
    parser.add_argument("--reference", action="store_true",
                        help="print every key as Markdown tables (docs/configuration.md)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.reference:
        sys.stdout.write(reference_markdown())
        return 0
    try:
        config = load_config_text("") if args.example else load_config(args.config)
    except ConfigError as err:
        print(f"uniun-runtime: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(dump_config(config, comments=not args.bare, portable=args.example))
    return 0
