-- 0003_workers: workers as they announce themselves on the workers topic.
--
-- Written only by the projector's worker directory (chronolog.projections.workers) from the
-- membership records, in one transaction together with the workers topic's rows of
-- projection_offsets. Not events: rebuilding from offset 0 of the workers topic gives the
-- same rows (on Kafka only the newest record per worker is kept there).

CREATE TABLE workers (
    worker_id   text        PRIMARY KEY,
    classes     jsonb       NOT NULL,   -- {"<class>": {"jobTypes": [...], "slots": n}}
    started_at  timestamptz NOT NULL,
    last_seen   timestamptz NOT NULL,   -- sent_at of the newest record
    stopped     boolean     NOT NULL DEFAULT false,  -- the newest record said it was stopping
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Every job type any worker has ever announced per resource class: what "a worker of this
-- class has served this job type" means when a schedule is created.
CREATE TABLE served_job_types (
    resource_class text        NOT NULL,
    job_type       text        NOT NULL,
    first_seen     timestamptz NOT NULL,
    last_seen      timestamptz NOT NULL,
    PRIMARY KEY (resource_class, job_type)
);
