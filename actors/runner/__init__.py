"""The runner process: the worker actor that owns the decoder session and the parked KV
snapshots."""
