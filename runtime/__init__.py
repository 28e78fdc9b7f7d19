"""The runtime: what turns rooms into running processes and commands (paths, config,
logging, process entry, heartbeats, supervisor, mains, CLI, benchmarks)."""
