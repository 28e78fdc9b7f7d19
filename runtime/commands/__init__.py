"""One module per ``uniun-runtime`` subcommand (or family of them)."""
