-- 0015_calendars: a tenant's calendars (docs/design.md §23) and the instants they exclude.
--
-- calendars holds each calendar's current revision and spec as its CalendarRevised wrote
-- them; a deleted calendar keeps its row (spec NULL, deleted_at set, the revision of its
-- deletion), so a re-created one goes on counting its revisions. runs.exclusion is the
-- calendar, revision and entry that excluded a SKIPPED instant (skipped_reason 'excluded').
--
-- The new column has no default: adding it rewrites nothing.

CREATE TABLE IF NOT EXISTS calendars (
    tenant      text        NOT NULL,
    name        text        NOT NULL,
    revision    bigint      NOT NULL,
    spec        jsonb,
    created_at  timestamptz,
    deleted_at  timestamptz,
    updated_at  timestamptz NOT NULL,
    PRIMARY KEY (tenant, name)
);

ALTER TABLE runs ADD COLUMN IF NOT EXISTS exclusion jsonb;
