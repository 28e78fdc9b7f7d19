"""Chaos tooling: faults injected into a running mesh, and hostile clients."""
