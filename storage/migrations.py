"""Schema as registered migrations (sqlite-utils ``Migrations``). Never edit an applied one: add a new one."""
from __future__ import annotations

from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

MIGRATIONS = Migrations("rlhf_studio")


def _run(db: Database, statements: str) -> None:
    # executescript() would COMMIT behind the migration's transaction, so run statement by statement.
    for stmt in statements.split(";\n"):
        if stmt.strip():
            db.execute(stmt)


@MIGRATIONS(name="m001_initial")
def m001_initial(db: Database) -> None:
    _run(db, """
CREATE TABLE annotators (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    role TEXT NOT NULL DEFAULT 'annotator' CHECK (role IN ('admin', 'annotator')),
    excluded INTEGER NOT NULL DEFAULT 0 CHECK (excluded IN (0, 1)),
    created TEXT NOT NULL
);
CREATE TABLE agents (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 64),
    system_prompt TEXT NOT NULL,
    base_model TEXT NOT NULL,
    generation TEXT NOT NULL DEFAULT '{}',
    created TEXT NOT NULL,
    updated TEXT NOT NULL
);
CREATE TABLE jobs (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    agent_id INTEGER REFERENCES agents(id),
    status TEXT NOT NULL DEFAULT 'queued'
        CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    progress REAL NOT NULL DEFAULT 0 CHECK (progress BETWEEN 0 AND 1),
    phase TEXT NOT NULL DEFAULT '',
    message TEXT NOT NULL DEFAULT '',
    config TEXT NOT NULL DEFAULT '{}',
    result TEXT NOT NULL DEFAULT '{}',
    error TEXT,
    pid INTEGER,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    checkpoint TEXT,
    created TEXT NOT NULL,
    started TEXT,
    finished TEXT,
    heartbeat TEXT
);
CREATE INDEX jobs_status ON jobs(status, id);
CREATE TABLE job_metrics (
    id INTEGER PRIMARY KEY,
    job_id INTEGER NOT NULL REFERENCES jobs(id),
    step INTEGER NOT NULL,
    key TEXT NOT NULL,
    value REAL,
    created TEXT NOT NULL
);
CREATE INDEX job_metrics_job ON job_metrics(job_id, key, step);
CREATE TABLE job_logs (
    id INTEGER PRIMARY KEY,
    job_id INTEGER NOT NULL REFERENCES jobs(id),
    level TEXT NOT NULL DEFAULT 'info',
    line TEXT NOT NULL,
    created TEXT NOT NULL
);
CREATE INDEX job_logs_job ON job_logs(job_id, id);
CREATE TABLE reward_models (
    id INTEGER PRIMARY KEY,
    agent_id INTEGER NOT NULL REFERENCES agents(id),
    path TEXT NOT NULL,
    mode TEXT NOT NULL CHECK (mode IN ('pairwise', 'pointwise')),
    data_snapshot TEXT NOT NULL DEFAULT '{}',
    config TEXT NOT NULL DEFAULT '{}',
    metrics TEXT NOT NULL DEFAULT '{}',
    job_id INTEGER REFERENCES jobs(id),
    created TEXT NOT NULL
);
CREATE TABLE policies (
    id INTEGER PRIMARY KEY,
    agent_id INTEGER NOT NULL REFERENCES agents(id),
    version INTEGER NOT NULL CHECK (version >= 0),
    parent_id INTEGER REFERENCES policies(id),
    adapter_path TEXT,
    status TEXT NOT NULL CHECK (status IN ('active', 'candidate', 'archived', 'broken')),
    reward_model_id INTEGER REFERENCES reward_models(id),
    job_id INTEGER REFERENCES jobs(id),
    data_snapshot TEXT NOT NULL DEFAULT '{}',
    config TEXT NOT NULL DEFAULT '{}',
    metrics TEXT NOT NULL DEFAULT '{}',
    error TEXT,
    created TEXT NOT NULL,
    UNIQUE (agent_id, version)
);
CREATE UNIQUE INDEX policies_one_active ON policies(agent_id) WHERE status = 'active';
CREATE TABLE conversations (
    id INTEGER PRIMARY KEY,
    agent_id INTEGER NOT NULL REFERENCES agents(id),
    annotator_id INTEGER REFERENCES annotators(id),
    system_prompt TEXT NOT NULL,
    source TEXT NOT NULL DEFAULT 'chat',
    created TEXT NOT NULL
);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id),
    parent_id INTEGER REFERENCES messages(id),
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
    content TEXT NOT NULL CHECK (role = 'assistant' OR length(content) > 0),
    context_key TEXT NOT NULL,
    policy_id INTEGER REFERENCES policies(id),
    gen_params TEXT NOT NULL DEFAULT '{}',
    latency_ms REAL,
    created TEXT NOT NULL
);
CREATE INDEX messages_conversation ON messages(conversation_id, id);
CREATE INDEX messages_parent ON messages(parent_id);
CREATE INDEX messages_context ON messages(context_key);
CREATE TABLE ratings (
    id INTEGER PRIMARY KEY,
    message_id INTEGER NOT NULL REFERENCES messages(id),
    annotator_id INTEGER REFERENCES annotators(id),
    thumb INTEGER CHECK (thumb IN (-1, 1)),
    score INTEGER CHECK (score BETWEEN 1 AND 5),
    flags TEXT,
    note TEXT,
    created TEXT NOT NULL,
    CHECK (thumb IS NOT NULL OR score IS NOT NULL OR flags IS NOT NULL OR note IS NOT NULL)
);
CREATE INDEX ratings_message ON ratings(message_id, id);
CREATE TABLE arena_pairs (
    id TEXT PRIMARY KEY,
    agent_id INTEGER NOT NULL REFERENCES agents(id),
    message_a_id INTEGER NOT NULL REFERENCES messages(id),
    message_b_id INTEGER NOT NULL REFERENCES messages(id),
    created TEXT NOT NULL
);
CREATE TABLE comparisons (
    id INTEGER PRIMARY KEY,
    message_a_id INTEGER NOT NULL REFERENCES messages(id),
    message_b_id INTEGER NOT NULL REFERENCES messages(id),
    policy_a_id INTEGER REFERENCES policies(id),
    policy_b_id INTEGER REFERENCES policies(id),
    winner TEXT NOT NULL CHECK (winner IN ('a', 'b', 'tie', 'both_bad')),
    annotator_id INTEGER REFERENCES annotators(id),
    pair_id TEXT UNIQUE REFERENCES arena_pairs(id),
    created TEXT NOT NULL,
    CHECK (message_a_id != message_b_id)
);
CREATE INDEX comparisons_messages ON comparisons(message_a_id, message_b_id);
CREATE TABLE scheduler_rules (
    agent_id INTEGER PRIMARY KEY REFERENCES agents(id),
    enabled INTEGER NOT NULL DEFAULT 0,
    min_new_feedback INTEGER NOT NULL,
    min_interval_minutes REAL NOT NULL,
    cron TEXT NOT NULL DEFAULT '',
    updated TEXT NOT NULL
);
CREATE TABLE eval_samples (
    id INTEGER PRIMARY KEY,
    policy_id INTEGER NOT NULL REFERENCES policies(id),
    prompt_index INTEGER NOT NULL,
    prompt TEXT NOT NULL,
    reply TEXT NOT NULL,
    reward REAL,
    created TEXT NOT NULL,
    UNIQUE (policy_id, prompt_index)
)
""")


@MIGRATIONS(name="m002_auth")
def m002_auth(db: Database) -> None:
    # Sign-in for teams (issue 7): a password hash per user (scrypt, never plaintext) and API tokens kept
    # as SHA-256 digests; a revoked token stays for the record.
    _run(db, """
ALTER TABLE annotators ADD COLUMN password_hash TEXT;
CREATE TABLE api_tokens (
    id INTEGER PRIMARY KEY,
    annotator_id INTEGER NOT NULL REFERENCES annotators(id),
    token_hash TEXT NOT NULL UNIQUE,
    label TEXT NOT NULL DEFAULT '',
    created TEXT NOT NULL,
    revoked INTEGER NOT NULL DEFAULT 0 CHECK (revoked IN (0, 1))
)
""")


@MIGRATIONS(name="m003_vote_queue")
def m003_vote_queue(db: Database) -> None:
    # The vote queue (issue 17): an item is one context with two stored replies (a conversation of source
    # 'queue'); an assignment is one annotator being shown one item, and their vote is an ordinary comparison.
    # One assignment per (item, annotator): the anonymous annotator (NULL) counts as one person.
    _run(db, """
CREATE TABLE queue_items (
    id INTEGER PRIMARY KEY,
    agent_id INTEGER NOT NULL REFERENCES agents(id),
    context_key TEXT NOT NULL,
    message_a_id INTEGER NOT NULL REFERENCES messages(id),
    message_b_id INTEGER NOT NULL REFERENCES messages(id),
    policy_a_id INTEGER REFERENCES policies(id),
    policy_b_id INTEGER REFERENCES policies(id),
    source TEXT NOT NULL DEFAULT 'starter',
    votes_wanted INTEGER NOT NULL DEFAULT 1 CHECK (votes_wanted BETWEEN 1 AND 10),
    p_a REAL,
    uncertainty REAL,
    scored_pairs INTEGER,
    created TEXT NOT NULL,
    expires TEXT NOT NULL,
    CHECK (message_a_id != message_b_id)
);
CREATE INDEX queue_items_agent ON queue_items(agent_id, expires);
CREATE INDEX queue_items_context ON queue_items(agent_id, context_key);
CREATE TABLE queue_assignments (
    id INTEGER PRIMARY KEY,
    item_id INTEGER NOT NULL REFERENCES queue_items(id),
    annotator_id INTEGER REFERENCES annotators(id),
    reason TEXT NOT NULL,
    comparison_id INTEGER REFERENCES comparisons(id),
    created TEXT NOT NULL,
    voted TEXT
);
CREATE UNIQUE INDEX queue_assignments_once ON queue_assignments(item_id, COALESCE(annotator_id, 0));
CREATE INDEX queue_assignments_annotator ON queue_assignments(annotator_id, voted)
""")


@MIGRATIONS(name="m004_security")
def m004_security(db: Database) -> None:
    # API tokens may expire (issue 24): an expired token answers 401 like a revoked one; NULL = never.
    _run(db, """
ALTER TABLE api_tokens ADD COLUMN expires TEXT
""")


@MIGRATIONS(name="m005_annotator_day")
def m005_annotator_day(db: Database) -> None:
    # An annotator's day in the browser (issue 23): per-agent annotation guidelines; a reply's generated token
    # count (a reply that stopped at max_new_tokens is marked as cut); a skipped vote-queue item (it goes to
    # others, never back to the one who skipped it); and the index behind each user's conversation list.
    _run(db, """
ALTER TABLE agents ADD COLUMN guidelines TEXT NOT NULL DEFAULT '';
ALTER TABLE messages ADD COLUMN n_tokens INTEGER;
ALTER TABLE queue_assignments ADD COLUMN skipped TEXT;
CREATE INDEX conversations_annotator ON conversations(annotator_id, agent_id, id)
""")


@MIGRATIONS(name="m007_relative_paths")
def m007_relative_paths(db: Database) -> None:
    # A data dir that can be moved or restored (issue 28): paths under the data dir (the database file's
    # directory) become relative to it; paths outside it stay absolute. Paths written relative to the app's
    # working directory are read as the app read them, from the working directory this migration runs in.
    from pathlib import Path

    from storage.paths import from_legacy

    main = next((row[2] for row in db.execute("PRAGMA database_list").fetchall() if row[1] == "main"), "")
    if not main:  # an in-memory database has no data dir
        return
    root = Path(main).parent
    for table, column in (("policies", "adapter_path"), ("reward_models", "path"), ("jobs", "checkpoint")):
        for row_id, value in db.execute(f"SELECT id, {column} FROM {table} WHERE {column} IS NOT NULL").fetchall():
            stored = from_legacy(value, root)
            if stored != value:
                db.execute(f"UPDATE {table} SET {column} = ? WHERE id = ?", [stored, row_id])


@MIGRATIONS(name="m009_rating_withdrawals")
def m009_rating_withdrawals(db: Database) -> None:
    # A thumb clicked again is taken back (issue 34): feedback stays append-only, so a withdrawal is its own event
    # that points at the rating event whose value it withdraws. One withdrawal per (rating event, field): a double
    # click stores one. Folding an annotator's events, a withdrawn value counts as no value from that event on.
    _run(db, """
CREATE TABLE rating_withdrawals (
    id INTEGER PRIMARY KEY,
    rating_id INTEGER NOT NULL REFERENCES ratings(id),
    field TEXT NOT NULL CHECK (field IN ('thumb', 'score')),
    created TEXT NOT NULL,
    UNIQUE (rating_id, field)
)
""")


@MIGRATIONS(name="m010_job_progressed")
def m010_job_progressed(db: Database) -> None:
    # When a job's progress last moved (issue 42): the time left is counted down from the pace at that moment, so
    # it never grows while the progress stands still, and the page can say for how long it has stood.
    _run(db, "ALTER TABLE jobs ADD COLUMN progressed TEXT")


@MIGRATIONS(name="m011_agent_chat_template")
def m011_agent_chat_template(db: Database) -> None:
    # An agent's own chat template (issue 43): NULL means the base model's (or plain lines when it has none).
    _run(db, "ALTER TABLE agents ADD COLUMN chat_template TEXT")


def schema_version(db: Database) -> int:
    """Number of applied migrations: the queryable schema version."""
    return len(MIGRATIONS.applied(db))
