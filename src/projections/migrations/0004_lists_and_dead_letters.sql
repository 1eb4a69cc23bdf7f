-- 0004_lists_and_dead_letters: the tenant-wide lists of the API (GET /v1/schedules,
-- GET /v1/runs, GET /v1/dlq).

-- A tenant's schedules by ID in code-point order (whatever the database's collation), for
-- the keyset cursor and the literal ID-prefix filter of GET /v1/schedules.
CREATE INDEX IF NOT EXISTS schedules_by_id ON schedules (tenant, schedule_id COLLATE "C");

-- A tenant's runs across its schedules, newest first, for the (scheduled_at, run_id)
-- cursor of GET /v1/runs.
CREATE INDEX IF NOT EXISTS runs_by_tenant ON runs (tenant, scheduled_at DESC, run_id DESC);

-- Dead letters as the projector folds them from the dlq topic
-- (chronolog.projections.dead_letters): one row per letter key, the first letter of a key
-- kept (a consumer that wrote one again after a crash changes nothing), so a replay of the
-- topic gives the same rows. Written in one transaction with the dlq topic's rows of
-- projection_offsets. tenant / schedule_id: what the skipped record names (NULL: nothing).
CREATE TABLE IF NOT EXISTS dead_letters (
    consumer         text        NOT NULL,
    source_topic     text        NOT NULL,
    source_partition integer     NOT NULL,
    source_offset    bigint      NOT NULL,
    tenant           text,
    schedule_id      text,
    reason           text        NOT NULL,
    error_class      text        NOT NULL,
    command_id       text,
    original         text        NOT NULL,   -- base64 of the record's first 64 KiB
    original_size    bigint,
    dead_lettered_at timestamptz NOT NULL,   -- the letter's time (else its record's append time)
    dlq_partition    integer     NOT NULL,   -- where the letter is in the dlq topic
    dlq_offset       bigint      NOT NULL,
    PRIMARY KEY (consumer, source_topic, source_partition, source_offset)
);

-- Oldest first, for an operator and for a tenant: (dead_lettered_at, dlq_partition,
-- dlq_offset) is unique and never changes.
CREATE INDEX IF NOT EXISTS dead_letters_by_time
    ON dead_letters (dead_lettered_at, dlq_partition, dlq_offset);
CREATE INDEX IF NOT EXISTS dead_letters_by_tenant
    ON dead_letters (tenant, dead_lettered_at, dlq_partition, dlq_offset);
