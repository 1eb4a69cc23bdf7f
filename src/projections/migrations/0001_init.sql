-- 0001_init: the read model (docs/design.md §9). snake_case here; camelCase exists only at the API.
--
-- Every table is written only by the projector, from the events log, in one transaction
-- together with projection_offsets. Rebuilding from offset 0 gives the same rows.
--
-- Nullability convention: a column is NOT NULL without a default only if the event that
-- creates the row always sets it (the store's TableSpec.required mirrors this, and a
-- contract test checks the two agree). Later partial changes become UPDATEs, never INSERTs
-- with missing NOT NULL columns.
--
-- No foreign keys: rows are projections of one ordered partition each; FKs would only add
-- write cost and ordering constraints between tables inside a batch.

CREATE TABLE schedules (
    tenant        text        NOT NULL,
    schedule_id   text        NOT NULL,
    revision      bigint      NOT NULL,
    state         text        NOT NULL CHECK (state IN ('ACTIVE', 'PAUSED', 'DELETED')),
    spec          jsonb       NOT NULL,
    request_key   text,
    anchor        timestamptz,
    fence         bigint      NOT NULL DEFAULT 0,   -- the schedule's current fence
    next_run_at   timestamptz,                      -- next nominal instant
    next_due_at   timestamptz,                      -- next_run_at plus jitter
    paused_at     timestamptz,
    pause_reason  text,
    deleted_at    timestamptz,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,             -- last change of definition or state
    last_event_at timestamptz NOT NULL,             -- last event of any kind on the aggregate
    PRIMARY KEY (tenant, schedule_id)
);

-- The due index: active schedules by their next instant.
CREATE INDEX schedules_due ON schedules (next_run_at) WHERE state = 'ACTIVE';

CREATE TABLE runs (
    run_id                    text        PRIMARY KEY,
    tenant                    text        NOT NULL,
    schedule_id               text        NOT NULL,
    scheduled_at              timestamptz NOT NULL,
    due_at                    timestamptz,          -- scheduled_at plus jitter
    revision                  bigint      NOT NULL, -- the revision it was materialized with
    trigger                   text        NOT NULL CHECK (trigger IN ('schedule', 'manual')),
    request_key               text,                 -- manual triggers
    state                     text        NOT NULL CHECK (state IN (
                                  'PENDING', 'READY', 'LEASED', 'RETRY_WAIT', 'SUCCEEDED',
                                  'DEAD', 'RECONCILING', 'CANCELLED', 'SKIPPED')),
    attempt                   integer     NOT NULL DEFAULT 0,
    job_type                  text,
    params                    jsonb,
    resource_class            text,
    priority                  integer,
    sequence                  bigint,
    start_deadline_at         timestamptz,
    materialized_at           timestamptz,
    ready_at                  timestamptz,          -- when it last became READY
    retry_at                  timestamptz,
    started_at                timestamptz,          -- first claim
    finished_at               timestamptz,          -- reached a terminal state
    -- start lateness: first claim versus the intended start (due_at, else scheduled_at)
    lateness_ms               bigint GENERATED ALWAYS AS (
                                  (EXTRACT(EPOCH FROM (started_at - COALESCE(due_at, scheduled_at)))
                                   * 1000)::bigint) STORED,
    result_checksum           text,
    result_size               bigint,
    result_uri                text,
    result_inline             jsonb,
    result_attempt            integer,
    skipped_reason            text,
    skipped_through           timestamptz,          -- a collapsed range of skipped instants
    skipped_count             integer     NOT NULL DEFAULT 0,
    cancellation_requested    boolean     NOT NULL DEFAULT false,
    cancel_reason             text,
    dead_reason               text,
    dead_message              text,
    last_error_class          text,
    last_error                text,
    reconciliation            jsonb,                -- why reconciliation was required
    reconciliation_resolution jsonb,                -- how it was resolved
    updated_at                timestamptz NOT NULL
);

-- History of a schedule, newest first, for the (scheduled_at, run_id) cursor.
CREATE INDEX runs_history ON runs (tenant, schedule_id, scheduled_at DESC, run_id DESC);
-- Oldest due age: READY runs by when they became ready.
CREATE INDEX runs_ready ON runs (ready_at) WHERE state = 'READY';
-- No unique index on (tenant, schedule_id, scheduled_at) WHERE trigger = 'schedule': the run
-- ID is a hash of exactly that occurrence key (domain/ids.py), so the primary key already
-- makes a scheduled occurrence one row, and a second constraint would only cost writes (or,
-- on a log that broke the rule, wedge the projector; `chronolog audit` reports that instead).

CREATE TABLE attempts (
    run_id      text        NOT NULL,
    attempt     integer     NOT NULL,
    tenant      text        NOT NULL,
    schedule_id text        NOT NULL,
    fence       bigint      NOT NULL,
    worker_id   text        NOT NULL,
    claimed_at  timestamptz NOT NULL,
    lease_until timestamptz NOT NULL,
    outcome     text,                 -- NULL while open; succeeded | failed | lease_expired
    error_class text,
    error       text,
    finished_at timestamptz,
    updated_at  timestamptz NOT NULL,
    PRIMARY KEY (run_id, attempt)
);

-- Expired leases: open attempts by lease end.
CREATE INDEX attempts_open ON attempts (lease_until) WHERE outcome IS NULL;

CREATE TABLE effects (
    effect_id   text        PRIMARY KEY,
    tenant      text        NOT NULL,
    schedule_id text        NOT NULL,
    run_id      text        NOT NULL,
    kind        text        NOT NULL,
    state       text        NOT NULL, -- INTENDED | SUCCEEDED | UNCERTAIN | FAILED | RECONCILING | ABANDONED
    attempts    integer     NOT NULL DEFAULT 0,
    checksum    text,
    config      jsonb,
    evidence    jsonb,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);

CREATE INDEX effects_by_run ON effects (run_id);

CREATE TABLE projection_offsets (
    projection    text        NOT NULL,
    topic         text        NOT NULL,
    partition     integer     NOT NULL,
    next_offset   bigint      NOT NULL CHECK (next_offset >= 0),
    last_event_at timestamptz,          -- authority time of the last event applied
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (projection, topic, partition)
);
