"""The sections of the runtime's configuration: one frozen dataclass each.

Every tunable's default and unit is written next to it: the ``doc`` metadata of each
field is the single source for the comments in ``examples/uniun.toml``,
``docs/configuration.md`` and the dumped effective config (``config_toml.py``). Loading
and validating a file is ``config.py``'s job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from uniun.actors.policy import PolicyConfig
from uniun.actors.scheduler.admission import CHAT_RESERVE_SHARE, CLIENT_SHARE
from uniun.actors.scheduler.front import CONN_PENDING_CAP, PENDING_CAP
from uniun.protocol.liveness import Liveness
from uniun.runtime.config_producers import ProducersConfig

DEFAULT_CHAT_MODEL = "smollm2-135m-instruct"
DEFAULT_EMBED_MODEL = "all-minilm-l6-v2"
POLICY_NAMES = ("uniun", "fcfs")
MIB = 1024 * 1024


def _doc(text: str) -> dict[str, str]:
    return {"doc": text}


@dataclass(frozen=True)
class FrontConfig:
    """The scheduler's front ROUTER socket (docs/protocol.md, "Transport")."""

    # Default "" means ipc://$UNIUN_HOME/run/front.sock; filled in by load_config.
    endpoint: str = field(default="", metadata=_doc(
        "where clients connect: ipc://PATH or tcp://HOST:PORT "
        "(default ipc://$UNIUN_HOME/run/front.sock)"))
    # Milliseconds; default 500.
    linger_ms: int = field(default=500, metadata=_doc(
        "ms the front socket may keep unsent replies at shutdown (default 500)"))
    # Requests; default 16384. One more from that connection is answered queue_full.
    conn_pending_cap: int = field(default=CONN_PENDING_CAP, metadata=_doc(
        "requests one client connection may have waiting in the scheduler; more are "
        f"answered queue_full with a retry hint (default {CONN_PENDING_CAP})"))
    # Requests; default 65536. At the cap the front stops reading until a batch is taken.
    pending_cap: int = field(default=PENDING_CAP, metadata=_doc(
        "requests of all connections waiting in the scheduler; at the cap the front stops "
        f"reading and ZeroMQ pushes back on senders (default {PENDING_CAP})"))


@dataclass(frozen=True)
class PolicySection:
    """Which scheduling policy runs, and overrides of its ``PolicyConfig`` fields."""

    # "uniun" (five tiers, preemptive) or "fcfs" (baseline: one FIFO, no preemption).
    name: str = field(default="uniun", metadata=_doc(
        "scheduling policy: \"uniun\" (five tiers, preemptive) or \"fcfs\" (baseline)"))
    # Field name -> value, checked against uniun.actors.policy.PolicyConfig.
    overrides: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def policy_config(self) -> PolicyConfig:
        """The policy room's ``PolicyConfig`` with this file's overrides applied."""
        return dataclasses.replace(PolicyConfig(), **dict(self.overrides))


@dataclass(frozen=True)
class ModelsConfig:
    """Which models the runtime uses by default."""

    # Model store id; default smollm2-135m-instruct (pulled from PyPI on first start).
    chat_model: str = field(default=DEFAULT_CHAT_MODEL, metadata=_doc(
        "default model of jobs without model_id (default smollm2-135m-instruct)"))
    # Model store id; default all-minilm-l6-v2.
    embed_model: str = field(default=DEFAULT_EMBED_MODEL, metadata=_doc(
        "model of the embedding pool (default all-minilm-l6-v2)"))
    # Bool; default true.
    pull_on_start: bool = field(default=True, metadata=_doc(
        "`start` fetches and converts the chat model if the store lacks it (default true)"))


@dataclass(frozen=True)
class JobsConfig:
    """What jobs the front accepts."""

    kinds: tuple[str, ...] = field(default=("chat", "extract", "nataraj", "gana"),
                                   metadata=_doc("job kinds the front accepts "
                                                 "(default chat, extract, nataraj, gana)"))


@dataclass(frozen=True)
class LimitsConfig:
    """Hard limits that protect the scheduler from oversized or runaway input."""

    # Bytes; default 1 MiB (docs/protocol.md).
    max_frame_bytes: int = field(default=MIB, metadata=_doc(
        "largest accepted message frame, bytes (default 1048576 = 1 MiB)"))
    # Jobs; default 10000. Beyond it submit answers queue_full.
    queue_cap: int = field(default=10_000, metadata=_doc(
        "most jobs queued at once; more get error queue_full (default 10000)"))
    # Share of queue_cap, 0 to below 1; default 0.1 (rounded up: 1000 of 10000).
    chat_reserve_share: float = field(default=CHAT_RESERVE_SHARE, metadata=_doc(
        "share of queue_cap only chats may take: background jobs (every other kind) get "
        "queue_full once the rest is live, so they never crowd a chat out (default 0.1)"))
    # Share of the background room, above 0 to 1; default 0.5 (rounded down, at least 1).
    client_share: float = field(default=CLIENT_SHARE, metadata=_doc(
        "share of the background room (queue_cap less the chat reserve) one client may "
        "hold in open background jobs; more get queue_full. A client is its CURVE key, "
        "else its connection (default 0.5)"))
    # Tokens; default 4096.
    max_new_tokens_cap: int = field(default=4096, metadata=_doc(
        "largest max_new_tokens a job may ask for (default 4096)"))
    # Characters; default 200000.
    max_prompt_chars: int = field(default=200_000, metadata=_doc(
        "longest prompt/messages text of a job, characters (default 200000)"))
    # Seconds; default 2. The grammar sandbox's limit for compiling one client schema.
    schema_compile_timeout_s: float = field(default=2.0, metadata=_doc(
        "longest a client's JSON Schema or tool schema may take to compile in the grammar "
        "sandbox before the submit is refused (docs/security.md) (default 2.0)"))


@dataclass(frozen=True)
class RunnerConfig:
    """The runner process: ONNX Runtime threads, prompt passes and the parked KV-snapshot store."""

    # Threads; default 2 (one per core on the 2-core target machine).
    intra_op_threads: int = field(default=2, metadata=_doc(
        "ONNX Runtime intra-op threads, used when device.thread_budget is false; otherwise "
        "the budget chooses (docs/device.md) (default 2)"))
    # Seconds of compute per prompt pass, in ms; default 50. 0: fixed passes.
    pass_target_ms: float = field(default=50.0, metadata=_doc(
        "compute per prompt pass, ms: prompts are fed in passes sized from the model's "
        "measured prefill rate, so a chat never waits long for a background pass (and an "
        "aborted one wastes little), longer where a pass's fixed cost nears it; 0 = every "
        "pass prefill_chunk_max positions (default 50)"))
    # Positions; default 16.
    prefill_chunk_min: int = field(default=16, metadata=_doc(
        "least prompt positions one pass feeds, however slow the model: smaller passes "
        "would run at decode speed (at least 2) (default 16)"))
    # Positions; default 64.
    prefill_chunk_max: int = field(default=64, metadata=_doc(
        "most prompt positions one pass feeds, however fast the model: a longer pass "
        "holds more activation memory (256 positions: ~25 MB more for SmolLM2) (at least "
        "2) (default 64)"))
    # Bytes; default -1: sized from the model and the machine (docs/kv-cache.md).
    snapshot_cap_bytes: int = field(default=-1, metadata=_doc(
        "memory for parked KV snapshots, bytes; over it partial eviction, then spill, "
        "then drop; -1 = snapshot_positions of the loaded model's KV, at most "
        "snapshot_memory_share of the memory available (default -1)"))
    # Positions; default 8192 (four 2,000-token jobs).
    snapshot_positions: int = field(default=8192, metadata=_doc(
        "with snapshot_cap_bytes = -1: positions of parked KV to hold in memory, times "
        "the model's KV bytes per position (default 8192)"))
    # Share of the memory available (MemAvailable, or less under a cgroup limit); 0.25.
    snapshot_memory_share: float = field(default=0.25, metadata=_doc(
        "with snapshot_cap_bytes = -1: the most of the memory available when a model "
        "loads (MemAvailable, or the cgroup's room if smaller) parked KV may take "
        "(default 0.25)"))
    # Path; default "" means $UNIUN_HOME/run/spill.
    spill_dir: str = field(default="", metadata=_doc(
        "where evicted snapshots are spilled (default $UNIUN_HOME/run/spill)"))
    # Bytes; default -1: sized from the model and the free disk.
    spill_cap_bytes: int = field(default=-1, metadata=_doc(
        "disk for spilled snapshots, bytes; beyond it snapshots are dropped; 0 = no "
        "spilling; -1 = spill_positions of the loaded model's KV, at most a quarter of "
        "the spill folder's free disk (default -1)"))
    # Positions; default 32768.
    spill_positions: int = field(default=32768, metadata=_doc(
        "with spill_cap_bytes = -1: positions of spilled KV to keep on disk (default "
        "32768)"))
    # "float32" or "float16"; default float32 (see docs/kv-cache.md, "Parked KV in fp16").
    parked_kv_dtype: str = field(default="float32", metadata=_doc(
        "element type of parked KV in memory: float32 (resume is free) or float16 (twice "
        "the jobs under snapshot_cap_bytes; a copy each way) (default float32)"))


@dataclass(frozen=True)
class SupervisorConfig:
    """How `uniun-runtime start` watches and restarts its children."""

    # Seconds; default 1.0.
    heartbeat_interval_s: float = field(default=1.0, metadata=_doc(
        "seconds between a child's heartbeats (default 1.0)"))
    # Count; default 3 (the ZeroMQ guide's liveness).
    missed_heartbeats: int = field(default=3, metadata=_doc(
        "missed heartbeats after which a child is declared dead and restarted (default 3)"))
    # Count; default 5.
    max_restarts: int = field(default=5, metadata=_doc(
        "restarts allowed within restart_window_s; one more stops the runtime (default 5)"))
    # Seconds; default 60.
    restart_window_s: float = field(default=60.0, metadata=_doc(
        "window of max_restarts, seconds (default 60)"))
    # Seconds; default 5.0. A child that beat this long before failing was healthy: its
    # restart is immediate. Shorter lives are a crash loop and back off 0.25 s .. 2 s.
    healthy_after_s: float = field(default=5.0, metadata=_doc(
        "a child up this long before it failed is restarted at once; shorter lives are a "
        "crash loop and back off 0.25, 0.5, 1, 2 s (default 5.0)"))
    # Seconds; default 5.
    stop_grace_s: float = field(default=5.0, metadata=_doc(
        "seconds a child gets to exit after SIGTERM before SIGKILL (default 5)"))
    # Seconds; default 60.
    start_timeout_s: float = field(default=60.0, metadata=_doc(
        "seconds a child gets to send its first heartbeat, and `start --detach` "
        "waits for the front to answer ping (default 60)"))

    # Seconds; default 120. Loading a model holds Python's GIL (Gemma 3's tokenizer
    # alone ~4.6 s of CPU, more on a busy device), so no heartbeat can go out; the
    # runner announces this much silence first instead of being restarted mid-load.
    load_grace_s: float = field(default=120.0, metadata=_doc(
        "seconds a runner loading a model may send no heartbeat; it announces them "
        "first (default 120)"))

    @property
    def liveness(self) -> Liveness:
        """The heartbeat rule every process applies to its peers (protocol/liveness.py)."""
        return Liveness(self.heartbeat_interval_s, self.missed_heartbeats)


@dataclass(frozen=True)
class EmbedConfig:
    """The embedding worker pool (its own ROUTER and processes)."""

    # Bool; default true: the extract producer embeds notes and `search` reads them.
    enabled: bool = field(default=True, metadata=_doc(
        "run the embedding pool (default true)"))
    # Processes; default 2.
    workers: int = field(default=2, metadata=_doc(
        "embedding worker processes = requests served at once (default 2)"))
    # Requests; default 64. Beyond it embed answers queue_full.
    queue_bound: int = field(default=64, metadata=_doc(
        "embed requests waiting at most; more get error queue_full (default 64)"))
    # Requests; default 16; 0 = only queue_bound applies. Waiting requests are taken
    # round-robin across connections.
    client_queue_bound: int = field(default=16, metadata=_doc(
        "embed requests one connection may have waiting; more get error queue_full with "
        "retry_after_s (default 16; 0 = no per-connection cap)"))
    # Texts; default 2. The yield check runs before each micro-batch.
    micro_batch: int = field(default=2, metadata=_doc(
        "texts per ONNX run of one embed request; interactive work waits for at most one "
        "(default 2)"))
    # Default "" means ipc://$UNIUN_HOME/run/embed.sock.
    endpoint: str = field(default="", metadata=_doc(
        "embedding pool endpoint (default ipc://$UNIUN_HOME/run/embed.sock)"))


@dataclass(frozen=True)
class HttpConfig:
    """The OpenAI-compatible HTTP gateway (docs/http.md)."""

    enabled: bool = field(default=True, metadata=_doc(
        "run the HTTP gateway (default true)"))
    # Loopback by default; anything else needs api_key (the runtime refuses to start).
    host: str = field(default="127.0.0.1", metadata=_doc(
        "address to bind (default 127.0.0.1; a non-loopback address requires api_key)"))
    port: int = field(default=8765, metadata=_doc(
        "TCP port (default 8765; 0 = any free port); the URL is written to "
        "$UNIUN_HOME/run/http.endpoint"))
    api_key: str = field(default="", metadata=_doc(
        "if set, every request but /health needs Authorization: Bearer KEY (default \"\")"))
    # Tokens; default 512 (OpenAI has no default; 128, the protocol's, is short for chat).
    default_max_tokens: int = field(default=512, metadata=_doc(
        "max_tokens of a chat completion that names none (default 512)"))
    # Requests; default 256. Each open job holds one gateway thread.
    max_open_requests: int = field(default=256, metadata=_doc(
        "jobs and embedding requests open through the gateway at once; more get 429 "
        "(default 256)"))
    # Requests; default 64. A client: its address, plus the console cookie if it sends one.
    max_open_requests_per_client: int = field(default=64, metadata=_doc(
        "jobs and embedding requests one client (its address, and the console's cookie "
        "when it sends one) may have open through the gateway; more get 429 (default 64)"))
    # Requests; default 32. A max_open_requests of 32 or less needs a smaller one.
    chat_reserve: int = field(default=32, metadata=_doc(
        "of max_open_requests, slots only chat jobs may take: background jobs (a "
        "uniun.kind other than the chat's) and embedding requests get 429 beyond the rest "
        "(default 32; must be below max_open_requests)"))
    # Names, no port; loopback names and the bind address are always accepted.
    allowed_hosts: tuple[str, ...] = field(default=(), metadata=_doc(
        "host names (no port) clients may call the gateway and the metrics listener by, "
        "besides localhost, 127.0.0.1, [::1] and [http] host; any other Host header gets "
        "421. \"*\" accepts any name and requires api_key (default [])"))
    # Connections; default 512. Each costs a socket and a little memory, no thread.
    max_connections: int = field(default=512, metadata=_doc(
        "connections (and requests in flight) the gateway serves at once; a request "
        "beyond gets 429 (default 512)"))
    # Seconds; default 10. Local clients send a request in milliseconds.
    read_timeout_s: float = field(default=10.0, metadata=_doc(
        "seconds a client has to send a request's headers (from connecting or from the "
        "previous answer), and again its body; else the connection is closed or "
        "answered 408 (default 10)"))
    # Bool; default true. The console's static files need no API key; its data does.
    console: bool = field(default=True, metadata=_doc(
        "serve the console (a web page: chat beside a live view of the device) at / "
        "(default true; docs/console.md)"))
    # Seconds; default 600. Read from the journal once per watch, bounded in size.
    console_window_s: float = field(default=600.0, metadata=_doc(
        "seconds of timeline a console page gets when it opens (default 600)"))
    # Bool; default true. A round SIGKILLs the runner once (the supervisor restarts it).
    console_chaos: bool = field(default=True, metadata=_doc(
        "the console may run a short chaos round against this runtime: one kill of the "
        "runner under load, then the verdict (default true)"))


@dataclass(frozen=True)
class LoggingConfig:
    """Per-process log files under $UNIUN_HOME/logs."""

    level: str = field(default="INFO", metadata=_doc(
        "loguru level: TRACE, DEBUG, INFO, WARNING or ERROR (default INFO)"))
    json: bool = field(default=False, metadata=_doc(
        "write every process's log as JSON lines (loguru's serializer; the job id is "
        "record.extra.job) instead of text (default false)"))


@dataclass(frozen=True)
class MetricsConfig:
    """Prometheus metrics (docs/observability.md). Served at /metrics of the HTTP gateway
    when it runs; host and port are for the supervisor's own endpoint otherwise."""

    enabled: bool = field(default=True, metadata=_doc(
        "collect and serve the uniun_* metrics (default true)"))
    host: str = field(default="127.0.0.1", metadata=_doc(
        "address of the metrics endpoint when no HTTP gateway runs (default 127.0.0.1, "
        "this machine only)"))
    port: int = field(default=0, metadata=_doc(
        "TCP port of http://HOST:PORT/metrics when no HTTP gateway runs; 0 = a free port "
        "(default 0). Either way the URL is written to $UNIUN_HOME/run/metrics.endpoint"))


@dataclass(frozen=True)
class TraceConfig:
    """The scheduler's timeline in the journal (``uniun-runtime trace export``)."""

    segments: bool = field(default=True, metadata=_doc(
        "record every job's run and wait segments and the preempt/swap/restart instants "
        "(default true)"))
    keep_segments: int = field(default=100000, metadata=_doc(
        "newest timeline rows kept in the journal, segments and instants each "
        "(default 100000)"))




@dataclass(frozen=True)
class JournalConfig:
    """The job journal, ``$UNIUN_HOME/journal.db`` (docs/scheduler-runner.md)."""

    synchronous: str = field(default="full", metadata=_doc(
        "full = a commit that records what a client was told (accepted, cancel "
        "acknowledged, a job's end) is flushed to the disk before the reply, so it "
        "survives a power cut (token commits are not flushed; they ride on the next "
        "flush); normal = nothing is flushed per commit: durable against a crash of the "
        "runtime, a power cut may lose the last commits (default full)"))


@dataclass(frozen=True)
class DeviceConfig:
    """Scheduling the whole device, not just the runner (docs/device.md)."""

    yield_signal: bool = field(default=True, metadata=_doc(
        "publish 'interactive work in flight' from the scheduler; the embedding workers "
        "and the background-Gana process start no new batch while it is on (default true)"))
    background_priority: str = field(default="nice", metadata=_doc(
        "CPU priority of the producers (extract, nataraj, gana, background-gana): nice "
        "(background_nice), idle (SCHED_IDLE, else nice: yields to every program on the "
        "machine, not only to the user's), or none (default nice)"))
    background_nice: int = field(default=10, metadata=_doc(
        "the producers' nice value, also used when SCHED_IDLE is not allowed "
        "(default 10)"))
    embed_priority: str = field(default="none", metadata=_doc(
        "CPU priority of the embedding pool and its workers, which answer the user's own "
        "apps: none (normal: an unrelated busy program cannot starve them; the yield "
        "signal keeps them out of a chat's way), nice (embed_nice) or idle (default none)"))
    embed_nice: int = field(default=2, metadata=_doc(
        "the embedding pool's nice value where embed_priority is nice, or idle is "
        "refused (default 2)"))
    thread_budget: bool = field(default=True, metadata=_doc(
        "choose the runner's, the embedding workers' and the background-Gana session's "
        "ONNX Runtime threads together from the core count; false: runner.intra_op_threads "
        "and producers.background_threads as written, one thread per worker (default true)"))
    cores: int = field(default=0, metadata=_doc(
        "cores the budget shares out; 0 = those this process may run on "
        "(os.sched_getaffinity) (default 0)"))
    runner_threads: int = field(default=0, metadata=_doc(
        "the runner's intra-op threads under the budget; 0 = chosen (default 0)"))
    embed_threads: int = field(default=0, metadata=_doc(
        "threads of each embedding worker under the budget; 0 = chosen (default 0)"))
    freeze_embed_workers: bool = field(default=False, metadata=_doc(
        "the embedding pool also stops its workers outright (SIGSTOP) while interactive "
        "work is in flight and continues them (SIGCONT) after, so the micro-batch in "
        "flight does not share the cores with a chat's prefill (default false)"))
    power_watch: bool = field(default=True, metadata=_doc(
        "read the charger, battery level and thermal state from sysfs and let them "
        "steer background work (docs/device.md, 'Power and heat') (default true)"))
    sysfs_root: str = field(default="/sys", metadata=_doc(
        "where the power watch reads class/power_supply and class/thermal; a test or "
        "a bench points it at a fake tree (default /sys)"))
    power_poll_s: float = field(default=5.0, metadata=_doc(
        "seconds between two readings of the power facts (default 5.0)"))
    runner_spinning: bool = field(default=True, metadata=_doc(
        "let the runner's idle ONNX Runtime threads spin (faster decode; the background "
        "runs below the runner and yields to chat, so it is not starved of anything it "
        "was owed) (default true)"))


SECTIONS: Mapping[str, type] = MappingProxyType({
    "front": FrontConfig, "policy": PolicySection, "models": ModelsConfig,
    "jobs": JobsConfig, "limits": LimitsConfig, "runner": RunnerConfig,
    "supervisor": SupervisorConfig, "embed": EmbedConfig, "http": HttpConfig,
    "producers": ProducersConfig,
    "logging": LoggingConfig, "metrics": MetricsConfig, "trace": TraceConfig,
    "journal": JournalConfig, "device": DeviceConfig,
})
