"""``uniun-runtime open-note PATH``: the "user opened a note" signal.

What the seed's note page does on open: ``foreground extract`` (so the scheduler hoists
the opened note's extraction to T1, preempting fair-pool work), plus an extraction job
for that note with ``foreground_hint`` (only hinted extract jobs reach T1, so a backfill
cannot ride along). A queued backfill job for the same note text is superseded and
cancelled, so the note is not extracted twice. The model's answer streams to stdout; the
result is stored like the producer's (raw and parsed, or the parse error) and shown.
On exit, also on Ctrl-C (which cancels the job), the foreground is restored.

A note whose current text was already extracted is shown from the store at once
(``--again`` extracts it anew).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from uniun.actors.producers.extract import (
    NAME as EXTRACT,
    OPEN_NOTE,
    ExtractSettings,
    note_job,
    store_extraction,
)
from uniun.actors.producers.notes import NOTE_SUFFIXES, extract_job_prefix, note_hash
from uniun.actors.producers.owners import owner_stamp
from uniun.protocol.client import ClientError
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
    stream_job,
)
from uniun.runtime.producers_main import notes_dir


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "open-note", help="open a note: extract its knowledge now, in the foreground",
        description="Signal that the user opened a note: sets foreground 'extract' and runs "
                    "the note's extraction with foreground_hint (tier T1), streaming the "
                    "model's answer. PATH is a .md/.txt file in the notes folder "
                    "($UNIUN_HOME/notes), or its name relative to that folder.")
    parser.add_argument("path", metavar="PATH", help="the note")
    parser.add_argument("--again", action="store_true",
                        help="extract even if this text was extracted before")
    add_json_flag(parser)
    add_connection_args(parser)
    parser.set_defaults(func=run)


def resolve_note(raw: str, folder: Path) -> tuple[Path, str]:
    """(file, path relative to the notes folder), or CommandError saying what is wrong."""
    root = folder.resolve()
    for candidate in (Path(raw).expanduser(), root / raw):
        path = candidate.resolve()
        if path.is_file():
            break
    else:
        raise CommandError(f"no such note: {raw} (notes live in {root})", code=2)
    try:
        rel = path.relative_to(root).as_posix()
    except ValueError:
        raise CommandError(f"{path} is not in the notes folder {root}; copy it there "
                           "first", code=2) from None
    if not path.name.lower().endswith(NOTE_SUFFIXES):
        raise CommandError(f"{rel}: notes are {' or '.join(NOTE_SUFFIXES)} files", code=2)
    return path, rel


def show(row: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps({k: row.get(k) for k in ("job_id", "note_path", "parsed",
                                                  "parse_error", "raw")}, ensure_ascii=False))
        return
    parsed = row.get("parsed")
    if parsed is None:
        print(f"[{row['note_path']}: the answer was not usable JSON: {row['parse_error']}]",
              file=sys.stderr)
        return
    names = ", ".join(e["name"] + (f" ({e['type']})" if e.get("type") else "")
                      for e in parsed["entities"]) or "-"
    print(f"entities: {names}")
    for rel in parsed["relations"]:
        print(f"  {rel['source']} --{rel['relation']}--> {rel['target']}")


def _stamped(made: tuple[dict[str, Any], dict[str, Any]]
             ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The job and its meta, the meta naming this process as the owner: if we are
    killed, the extract producer adopts the job as soon as it sees we are gone."""
    job, meta = made
    return job, {**meta, **owner_stamp()}


@client_command
def run(args: argparse.Namespace) -> int:
    config = runtime_config()
    folder = notes_dir(config)
    path, rel = resolve_note(args.path, folder)
    data = path.read_bytes()
    sha = note_hash(data)
    store = open_store(config)
    try:
        if not args.again and store.has_knowledge(rel, sha):
            show(store.knowledge_for(rel)[-1], as_json=args.json)
            return 0
        p = config.producers
        settings = ExtractSettings(
            notes_dir=folder, max_new_tokens=min(p.extract_max_new_tokens,
                                                 config.limits.max_new_tokens_cap),
            model_id=p.extract_model or None)
        text = data.decode("utf-8", errors="replace")
        with connect(args) as client, foreground_while(client, EXTRACT, timeout=args.timeout):
            job, superseded = store.supersede_jobs(
                extract_job_prefix(rel, sha), OPEN_NOTE,
                lambda n: _stamped(note_job(rel, sha, text, n, settings, hint=True)))
            for job_id in superseded:
                # Finished or not yet submitted: superseded either way.
                with contextlib.suppress(ClientError):
                    client.cancel(job_id, timeout=args.timeout)
            job = {**job, "stream": True}
            try:
                done = stream_job(client, job, timeout=args.timeout,
                                  out=sys.stderr if args.json else sys.stdout)
            except KeyboardInterrupt:
                store.set_job_state(job["job_id"], "cancelled", "cancelled by the user")
                print("\n[cancelled]", file=sys.stderr)
                return 130
            except ClientError as err:
                store.set_job_state(job["job_id"], "failed", f"{err.code}: {err.message}")
                raise
        row = store.job(job["job_id"])
        assert row is not None
        store_extraction(store, row, done)
        store.set_job_state(job["job_id"], "done")
        print(f"[{describe_done(done)}]", file=sys.stderr)
        show(store.knowledge_for(rel)[-1], as_json=args.json)
        return 0
    finally:
        store.close()
