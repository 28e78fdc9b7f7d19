"""End-to-end benchmarks: real runtimes, real sockets, the real model (``uniun-runtime bench``)."""
