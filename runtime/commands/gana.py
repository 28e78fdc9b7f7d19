"""``uniun-runtime gana run ID`` and ``gana list``: Ganas by hand.

``gana run ID`` is the seed's Gana form preview: the user is looking at this Gana, so it
sets ``foreground gana`` (T1) while the run streams, records the run in the results
database (runner ``scheduler``, no slot: it is not a scheduled fire, and the schedule is
not moved), and restores the foreground on exit; Ctrl-C cancels the run.
``gana list`` shows each Gana with its last fire and when it is next due.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from datetime import datetime
from typing import Any

from uniun.actors.producers.gana_cron import run_fields
from uniun.actors.producers.gana_schedule import (
    GanaConfigError,
    GanaDef,
    gana_job,
    load_ganas,
    next_slot,
)
from uniun.actors.producers.results_fires import last_slot
from uniun.runtime.commands.common import (
    CommandError,
    add_connection_args,
    client_command,
    connect,
    describe_done,
)
from uniun.runtime.commands.producer_common import (
    add_json_flag,
    foreground_while,
    open_store,
    runtime_config,
    short,
    stream_job,
)
from uniun.runtime.config import RuntimeConfig
from uniun.runtime.producers_main import ganas_file


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("gana", help="list Ganas or run one interactively",
                            description="Ganas are defined in $UNIUN_HOME/ganas.toml "
                                        "(docs/producers.md).")
    gsub = parser.add_subparsers(dest="gana_command", metavar="GANA_COMMAND")
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])
    run_p = gsub.add_parser("run", help="run one Gana now, in the foreground, streaming")
    run_p.add_argument("gana_id", metavar="ID")
    add_connection_args(run_p)
    run_p.set_defaults(func=run)
    list_p = gsub.add_parser("list", help="the Ganas, their last fire and next fire")
    add_json_flag(list_p)
    list_p.set_defaults(func=list_ganas)


def _ganas() -> tuple[dict[str, GanaDef], RuntimeConfig]:
    config = runtime_config()
    path = ganas_file(config)
    try:
        ganas = {g.id: g for g in load_ganas(path)}
    except GanaConfigError as err:
        raise CommandError(str(err), code=2) from None
    return ganas, config


@client_command
def run(args: argparse.Namespace) -> int:
    ganas, config = _ganas()
    gana = ganas.get(args.gana_id)
    if gana is None:
        known = ", ".join(sorted(ganas)) or "none"
        raise CommandError(f"no Gana {args.gana_id!r} in {ganas_file(config)} "
                           f"(defined: {known})", code=2)
    job = gana_job(gana, job_id=f"gana-{gana.id}-run-{uuid.uuid4().hex[:10]}", deadline=None,
                   max_new_tokens_cap=config.limits.max_new_tokens_cap)
    store = open_store(config)
    try:
        with connect(args) as client, foreground_while(client, "gana", timeout=args.timeout):
            try:
                done = stream_job(client, job, timeout=args.timeout)
            except KeyboardInterrupt:
                print("\n[cancelled]", file=sys.stderr)
                return 130
        row = {"job_id": job["job_id"], "job": job}
        store.add_gana_run(job_id=job["job_id"], gana_id=gana.id, slot=None,
                           **run_fields(row, done, "scheduler"))
        print(f"[{describe_done(done)}]", file=sys.stderr)
        return 0
    finally:
        store.close()


def list_ganas(args: argparse.Namespace) -> int:
    try:
        ganas, config = _ganas()
    except CommandError as err:
        print(f"uniun-runtime: {err}", file=sys.stderr)
        return err.code
    store = open_store(config)
    now = time.time()
    rows: list[dict[str, Any]] = []
    try:
        for gana in ganas.values():
            last = last_slot(store, gana.id)
            runs = store.gana_runs(gana.id)
            rows.append({"id": gana.id, "every_minutes": gana.every_minutes,
                         "model_id": gana.model_id, "last_fire": last,
                         "next_fire": next_slot(last, gana.every_s, now), "runs": len(runs),
                         "last_text": runs[-1]["text"] if runs else None})
    finally:
        store.close()
    if args.json:
        print(json.dumps(rows, ensure_ascii=False, indent=1))
        return 0
    if not rows:
        print(f"no Ganas defined in {ganas_file(config)}", file=sys.stderr)
    for r in rows:
        def when(t: float | None) -> str:
            return "-" if t is None else datetime.fromtimestamp(t).strftime("%H:%M:%S")
        print(f"{r['id']:<20} every {r['every_minutes']:g} min  last {when(r['last_fire'])}"
              f"  next {when(r['next_fire'])}  runs {r['runs']}  {short(r['last_text'], 40)}")
    return 0
