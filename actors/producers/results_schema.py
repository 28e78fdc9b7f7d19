"""The results database's schema, as an ordered list of migrations.

Rules of this file:

- ``MIGRATIONS[i]`` takes a database from ``user_version == i`` to ``i + 1``. Entries
  are never edited once released; a change is a new entry at the end.
- Each migration runs in one transaction together with the ``user_version`` bump, so
  a crash half-way leaves the old version intact and the next open retries it.
- Times are unix seconds (REAL). JSON columns hold UTF-8 JSON text.

Version 1 holds what users read (the results); version 2 adds the producers'
bookkeeping (jobs handed to the scheduler, Gana fire claims), which is what makes
"killing a producer loses nothing" and "every Gana fire exactly once" hold.
"""

from __future__ import annotations

MIGRATIONS: tuple[str, ...] = (
    # 0 -> 1: the results.
    """
    CREATE TABLE knowledge (
        id            INTEGER PRIMARY KEY,
        job_id        TEXT NOT NULL UNIQUE,
        note_path     TEXT NOT NULL,
        note_sha      TEXT NOT NULL,
        model_id      TEXT,
        raw           TEXT NOT NULL,
        parsed        TEXT,             -- JSON {entities, relations}, NULL if unparsable
        parse_error   TEXT,             -- why parsing failed, NULL if it worked
        finish_reason TEXT,
        total_s       REAL,
        created       REAL NOT NULL
    );
    CREATE INDEX knowledge_note ON knowledge (note_path);

    CREATE TABLE note_embeddings (
        note_path TEXT PRIMARY KEY,     -- the latest embedding of each note
        note_sha  TEXT NOT NULL,
        model_id  TEXT,
        dim       INTEGER NOT NULL,
        vector    BLOB NOT NULL,        -- float32 little-endian, L2-normalised
        created   REAL NOT NULL
    );

    CREATE TABLE deck_cards (
        id          INTEGER PRIMARY KEY,
        job_id      TEXT NOT NULL UNIQUE,
        topic       TEXT,
        text        TEXT NOT NULL,
        created     REAL NOT NULL,
        consumed_at REAL                -- NULL while the card is in the deck
    );

    CREATE TABLE gana_runs (
        id                INTEGER PRIMARY KEY,
        job_id            TEXT NOT NULL UNIQUE,
        gana_id           TEXT NOT NULL,
        slot              REAL,         -- scheduled fire time; NULL for interactive runs
        runner            TEXT NOT NULL,  -- 'scheduler' or 'background'
        model_id          TEXT,
        prompt            TEXT NOT NULL,
        text              TEXT NOT NULL,
        finish_reason     TEXT,
        completion_tokens INTEGER,
        queued_s          REAL,
        ttft_s            REAL,
        total_s           REAL,
        preemptions       INTEGER,
        started_at        REAL,
        finished_at       REAL NOT NULL
    );
    CREATE INDEX gana_runs_gana ON gana_runs (gana_id, slot);

    CREATE TABLE chat_messages (
        id           INTEGER PRIMARY KEY,
        conversation TEXT NOT NULL,
        role         TEXT NOT NULL,
        content      TEXT NOT NULL,
        job_id       TEXT,
        timings      TEXT,              -- JSON {queued_s, ttft_s, total_s} for answers
        created      REAL NOT NULL
    );
    CREATE INDEX chat_conversation ON chat_messages (conversation, id);
    """,
    # 1 -> 2: the producers' bookkeeping.
    """
    CREATE TABLE producer_jobs (
        job_id   TEXT PRIMARY KEY,      -- stable: the same work always gets the same id
        producer TEXT NOT NULL,
        job      TEXT NOT NULL,         -- JSON wire job map, exactly as submitted
        meta     TEXT NOT NULL,         -- JSON: what the producer needs to store the result
        state    TEXT NOT NULL,         -- 'pending' (persisted, not yet acknowledged),
                                        -- 'submitted', 'done', 'failed'
        error    TEXT,
        created  REAL NOT NULL,
        updated  REAL NOT NULL
    );
    CREATE INDEX producer_jobs_open ON producer_jobs (producer, state);

    CREATE TABLE gana_fires (
        gana_id     TEXT NOT NULL,
        slot        REAL NOT NULL,      -- the scheduled fire time
        job_id      TEXT NOT NULL UNIQUE,
        owner       TEXT NOT NULL,      -- 'cron' (through the scheduler) or 'background'
        state       TEXT NOT NULL,      -- 'claimed', 'done', 'failed'
        claimed_at  REAL NOT NULL,
        lease_until REAL,               -- background owner: renewed while it generates
        done_at     REAL,
        PRIMARY KEY (gana_id, slot)
    );
    CREATE INDEX gana_fires_open ON gana_fires (state, owner);
    """,
)

SCHEMA_VERSION = len(MIGRATIONS)
