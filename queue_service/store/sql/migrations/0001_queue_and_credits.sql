-- The queue (analysis_jobs), the credit ledger beside it, and per-user slot overrides.
-- Every hot statement is served by a partial index over the rows in flight, so cost grows with
-- the work in flight, not with the table's history.

CREATE TABLE analysis_jobs (
    job_id            uuid PRIMARY KEY,
    user_id           text NOT NULL,
    run_id            uuid NOT NULL UNIQUE,
    idempotency_key   text NOT NULL,
    -- sha256 of the admit payload, so a reused key with another payload is told apart.
    request_digest    bytea NOT NULL,
    status            text NOT NULL
        CHECK (status IN ('queued', 'pending', 'running', 'succeeded', 'failed', 'canceled')),
    -- FIFO order: a sequence value drawn under the user's lock, never a timestamp.
    queue_seq         bigint NOT NULL,
    -- The numbered first-pass slot (1..limit) an active job holds.
    slot              integer CHECK (slot >= 1),
    delta_of_job_id   uuid REFERENCES analysis_jobs (job_id),
    price             bigint NOT NULL CHECK (price >= 0),
    release_attempts  integer NOT NULL DEFAULT 0,
    next_release_at   timestamptz,
    release_deadline  timestamptz,
    next_reconcile_at timestamptz,
    last_error        text NOT NULL DEFAULT '',
    create_time       timestamptz NOT NULL DEFAULT clock_timestamp(),
    promote_time      timestamptz,
    start_time        timestamptz,
    end_time          timestamptz,
    CONSTRAINT analysis_jobs_idempotency UNIQUE (user_id, idempotency_key),
    CONSTRAINT analysis_jobs_slot_first_pass_only CHECK (slot IS NULL OR delta_of_job_id IS NULL),
    CONSTRAINT analysis_jobs_active_first_pass_has_slot
        CHECK (status NOT IN ('pending', 'running') OR delta_of_job_id IS NOT NULL OR slot IS NOT NULL)
);

CREATE SEQUENCE analysis_jobs_queue_seq AS bigint;

-- The database backstop for I1: two active holders of one slot cannot both commit, even if two
-- code versions disagree during a deploy.
CREATE UNIQUE INDEX analysis_jobs_one_holder_per_slot
    ON analysis_jobs (user_id, slot)
    WHERE status IN ('pending', 'running') AND delta_of_job_id IS NULL;

CREATE INDEX analysis_jobs_queued_in_order
    ON analysis_jobs (user_id, queue_seq)
    WHERE status = 'queued';

CREATE INDEX analysis_jobs_release_due
    ON analysis_jobs (next_release_at)
    WHERE status = 'pending';

CREATE INDEX analysis_jobs_reconcile_due
    ON analysis_jobs (next_reconcile_at)
    WHERE status = 'running';

CREATE INDEX analysis_jobs_user_newest_first
    ON analysis_jobs (user_id, queue_seq DESC);

CREATE INDEX analysis_jobs_recent_first_pass_durations
    ON analysis_jobs (end_time DESC)
    WHERE status = 'succeeded' AND delta_of_job_id IS NULL;

CREATE INDEX analysis_jobs_delta_base ON analysis_jobs (delta_of_job_id) WHERE delta_of_job_id IS NOT NULL;

-- Plan tiers: a per-user override of QUEUE_MAX_ACTIVE_PER_USER.
CREATE TABLE user_queue_limits (
    user_id    text PRIMARY KEY,
    max_active integer NOT NULL CHECK (max_active BETWEEN 1 AND 1000),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE credit_accounts (
    user_id    text PRIMARY KEY,
    balance    bigint NOT NULL CHECK (balance >= 0),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Credits move only through these entries; balance = sum(amount) per user (I3).
CREATE TABLE credit_ledger (
    entry_id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id         text NOT NULL,
    kind            text NOT NULL CHECK (kind IN ('grant', 'charge', 'refund')),
    amount          bigint NOT NULL,
    job_id          uuid REFERENCES analysis_jobs (job_id),
    idempotency_key text,
    create_time     timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT credit_ledger_sign CHECK (
        (kind = 'charge' AND amount < 0) OR (kind IN ('grant', 'refund') AND amount > 0)),
    CONSTRAINT credit_ledger_job_entries CHECK ((kind = 'grant') = (job_id IS NULL)),
    CONSTRAINT credit_ledger_grant_key CHECK ((kind = 'grant') = (idempotency_key IS NOT NULL)),
    -- A job is charged once and refunded at most once.
    CONSTRAINT credit_ledger_once_per_job UNIQUE (job_id, kind)
);

CREATE UNIQUE INDEX credit_ledger_grant_idempotency
    ON credit_ledger (user_id, idempotency_key)
    WHERE kind = 'grant';

CREATE INDEX credit_ledger_by_user ON credit_ledger (user_id);

-- Every status change (and every new last_error) is announced, so watchers and dispatchers on
-- every replica learn of it, whichever replica or code version made it.
CREATE FUNCTION analysis_jobs_announce_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(
        'analysis_job_changes',
        json_build_object(
            'user_id', NEW.user_id,
            'job_id', NEW.job_id,
            'status', NEW.status,
            'old_status', CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END
        )::text);
    RETURN NULL;
END;
$$;

CREATE TRIGGER analysis_jobs_announce_insert
    AFTER INSERT ON analysis_jobs
    FOR EACH ROW EXECUTE FUNCTION analysis_jobs_announce_change();

CREATE TRIGGER analysis_jobs_announce_update
    AFTER UPDATE ON analysis_jobs
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.last_error IS DISTINCT FROM NEW.last_error)
    EXECUTE FUNCTION analysis_jobs_announce_change();

-- The lowest free first-pass slot of a user (NULL when all are taken). Shared by admit and
-- promotion so both decide the same way.
CREATE FUNCTION analysis_jobs_free_slot(p_user_id text, p_default_max_active integer) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT s
      FROM generate_series(
               1,
               COALESCE((SELECT l.max_active FROM user_queue_limits l WHERE l.user_id = p_user_id),
                        p_default_max_active)) AS s
     WHERE NOT EXISTS (
               SELECT 1 FROM analysis_jobs a
                WHERE a.user_id = p_user_id AND a.slot = s
                  AND a.status IN ('pending', 'running') AND a.delta_of_job_id IS NULL)
     ORDER BY s
     LIMIT 1
$$;

-- The API's view of a job: its row plus what a waiting user wants to know (design 4b).
CREATE VIEW analysis_job_views AS
SELECT j.job_id, j.user_id, j.run_id, j.status, j.delta_of_job_id, j.release_attempts, j.last_error,
       j.create_time, j.promote_time, j.start_time, j.end_time, j.price, j.queue_seq,
       CASE WHEN j.status = 'queued' THEN (
           SELECT count(*) FROM analysis_jobs q
            WHERE q.user_id = j.user_id AND q.status = 'queued' AND q.queue_seq <= j.queue_seq)
       ELSE 0 END AS queue_position,
       CASE WHEN j.status = 'queued' THEN COALESCE(
           (SELECT q.job_id FROM analysis_jobs q
             WHERE q.user_id = j.user_id AND q.status = 'queued' AND q.queue_seq < j.queue_seq
             ORDER BY q.queue_seq DESC LIMIT 1),
           (SELECT a.job_id FROM analysis_jobs a
             WHERE a.user_id = j.user_id AND a.status IN ('pending', 'running') AND a.delta_of_job_id IS NULL
             ORDER BY a.promote_time, a.queue_seq LIMIT 1))
       END AS waiting_for_job_id,
       CASE WHEN j.status = 'queued' THEN (
           SELECT min(COALESCE(a.start_time, a.promote_time)) FROM analysis_jobs a
            WHERE a.user_id = j.user_id AND a.status IN ('pending', 'running') AND a.delta_of_job_id IS NULL)
       END AS active_since,
       (SELECT l.max_active FROM user_queue_limits l WHERE l.user_id = j.user_id) AS max_active_override,
       EXISTS (SELECT 1 FROM credit_ledger r WHERE r.job_id = j.job_id AND r.kind = 'refund') AS refunded
  FROM analysis_jobs j;
