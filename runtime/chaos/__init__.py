"""Chaos tooling: ``uniun-runtime chaos`` (a mixed workload, seeded faults, a Jepsen-style
verdict) and ``uniun-runtime fuzz`` (hostile frames against a running scheduler, or with
``--http`` hostile requests against its HTTP gateway).

The modules, one job each:

- :mod:`.ledger` -- what the clients saw of every job (pure bookkeeping, no I/O);
- :mod:`.wire` -- the raw-protocol client that feeds the ledger and re-attaches after a
  scheduler restart;
- :mod:`.workload` -- chats, background jobs of several kinds, clients that disconnect
  mid-stream; :mod:`.embeds` -- embedding requests in a thread of their own;
- :mod:`.faults` -- the seeded fault plan, the signals, and when a fault counts as
  recovered;
- :mod:`.verdict` -- the verdict from the ledger and the faults, as a map and as text;
- :mod:`.own_runtime` -- a runtime of the harness's own in a temporary home;
- :mod:`.harness` -- the run: calibrate fault-free, then inject, then drain, then judge;
- :mod:`.fuzz` -- the Hypothesis wire fuzzer: one reply per request, codes per the table,
  never ``internal``, no scheduler restart;
- :mod:`.http_fuzz` -- the HTTP fuzzer of the gateway (``fuzz --http``): no 5xx, OpenAI
  error objects only, nothing internal, the door shut, bounded RSS; its requests come
  from :mod:`.http_drafts`, go out through :mod:`.http_wire` (raw sockets), and
  :mod:`.http_probes` measures the door first.
"""
