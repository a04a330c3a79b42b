-- The fleet-wide capacity of the core (docs/design.md, "The core's capacity").
--
-- `queue_capacity` is one row: the most first-pass runs being released or judging at the core at
-- once across every replica (`capacity`, 0: unlimited), and what the core itself has told us
-- (`core_limit`, learned from RESOURCE_EXHAUSTED answers; `next_probe_at`, when the fleet may next
-- try one release above it). The first replica that starts seeds the row from QUEUE_CORE_CAPACITY;
-- OperatorService.SetCoreCapacity changes it, every change recorded in `queue_setting_changes`
-- with its actor, like a credit movement.
--
-- A first-pass job that becomes PENDING while the capacity is limited holds its user's slot but
-- waits for the core (`capacity_wait_since` set, no `capacity_token`, no release due). The grant
-- (`queue_grant_capacity`, under the fleet-wide capacity lock of `store/locks.py`) hands the
-- capacity that is free to waiting jobs in fair order and claims their releases. A granted job
-- holds a numbered token (1..capacity) until its run is settled: the partial unique index makes a
-- second holder of a token impossible, whatever code version wrote it, in the spirit of the slot
-- index. What is in use counts every first-pass run whose fate is unknown (PENDING with a token,
-- RUNNING, ended unsettled) and every delta re-check the core may be judging.
--
-- Additive: the functions of migrations 0009 and 0011 are unchanged. A BEFORE trigger turns a
-- first-pass job entering PENDING into a waiting one when the capacity is limited, so every path
-- that promotes (admit, promotion after an ending, settlement, the sweeper) waits alike.

CREATE TABLE queue_capacity (
    singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    capacity      integer NOT NULL CHECK (capacity >= 0 AND capacity <= 1000000),
    core_limit    integer CHECK (core_limit >= 0),
    next_probe_at timestamptz,
    core_refusals bigint NOT NULL DEFAULT 0,
    updated_by    text NOT NULL DEFAULT 'unknown',
    updated_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Every change of a fleet setting, with who made it (the actor of the call, as on ledger entries).
CREATE TABLE queue_setting_changes (
    change_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    setting     text NOT NULL CHECK (setting IN ('core_capacity', 'user_max_active')),
    user_id     text,
    old_value   integer,
    new_value   integer,
    actor       text NOT NULL,
    create_time timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK ((setting = 'user_max_active') = (user_id IS NOT NULL))
);

-- When each user's latest first-pass run was granted capacity (its release sent to the core; a
-- grant whose release is lost or given up still counts as her turn): the fair order serves
-- first the user who has waited longest since. Written by the grant, under the capacity lock; a
-- refusal gives the turn back (`capacity_turn_before` on the job: her turn before this grant).
CREATE TABLE user_capacity_turns (
    user_id      text PRIMARY KEY,
    last_turn_at timestamptz NOT NULL
);

ALTER TABLE analysis_jobs
    ADD COLUMN capacity_wait_since timestamptz,
    ADD COLUMN capacity_token integer CHECK (capacity_token >= 1),
    ADD COLUMN capacity_turn_before timestamptz;

CREATE UNIQUE INDEX analysis_jobs_one_holder_per_capacity_token ON analysis_jobs (capacity_token)
 WHERE capacity_token IS NOT NULL AND (status IN ('pending', 'running') OR run_settle_due_at IS NOT NULL);

CREATE INDEX analysis_jobs_waiting_for_capacity ON analysis_jobs (capacity_wait_since)
 WHERE status = 'pending' AND capacity_wait_since IS NOT NULL AND capacity_token IS NULL;

-- First-pass runs of one user (or of every user) that take capacity: the holders of the user's
-- slots (the slot index's own predicate, so that index serves it) that are not waiting.
CREATE FUNCTION queue_capacity_in_use_of_user(p_user_id text) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT count(*)::integer FROM analysis_jobs a
     WHERE a.user_id = p_user_id
       AND (a.status IN ('pending', 'running') OR a.run_settle_due_at IS NOT NULL) AND a.delta_of_job_id IS NULL
       AND (a.capacity_wait_since IS NULL OR a.capacity_token IS NOT NULL)
$$;

-- Everything the core may be judging for us: first-pass runs not waiting, and delta re-checks
-- running or ended unsettled (deltas never wait, but they take the core's capacity).
CREATE FUNCTION queue_capacity_in_use() RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT (SELECT count(*) FROM analysis_jobs a
             WHERE (a.status IN ('pending', 'running') OR a.run_settle_due_at IS NOT NULL) AND a.delta_of_job_id IS NULL
               AND (a.capacity_wait_since IS NULL OR a.capacity_token IS NOT NULL))::integer
         + (SELECT count(*) FROM analysis_jobs d
             WHERE d.status = 'running' AND d.delta_of_job_id IS NOT NULL)::integer
         + (SELECT count(*) FROM analysis_jobs u
             WHERE u.run_settle_due_at IS NOT NULL AND u.delta_of_job_id IS NOT NULL)::integer
$$;

-- A first-pass job entering PENDING while the capacity is limited (a capacity, or a limit the
-- core taught us) waits for the core: no release is due until the grant hands it capacity.
CREATE FUNCTION analysis_jobs_wait_for_capacity() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF (TG_OP = 'INSERT' OR OLD.status = 'queued')
       AND EXISTS (SELECT 1 FROM queue_capacity c WHERE c.capacity > 0 OR c.core_limit IS NOT NULL) THEN
        NEW.capacity_wait_since := clock_timestamp();
        NEW.capacity_token := NULL;
        NEW.next_release_at := NULL;
        NEW.release_attempts := CASE WHEN TG_OP = 'INSERT' THEN 0 ELSE OLD.release_attempts END;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER analysis_jobs_wait_for_capacity
    BEFORE INSERT OR UPDATE OF status ON analysis_jobs
    FOR EACH ROW WHEN (NEW.status = 'pending' AND NEW.delta_of_job_id IS NULL)
    EXECUTE FUNCTION analysis_jobs_wait_for_capacity();

-- The fair order of jobs waiting for capacity (max-min, then round-robin): fewest runs of the
-- user in use first; then the user who has waited longest since her latest first-pass run
-- was granted (or, never served, since her job began to wait); then the job that waited longest.
CREATE VIEW analysis_jobs_capacity_order AS
SELECT w.job_id, w.user_id, w.run_id, w.capacity_wait_since,
       row_number() OVER (ORDER BY queue_capacity_in_use_of_user(w.user_id),
                                   COALESCE(t.last_turn_at, w.capacity_wait_since),
                                   w.capacity_wait_since, w.queue_seq) AS capacity_position
  FROM analysis_jobs w
  LEFT JOIN user_capacity_turns t ON t.user_id = w.user_id
 WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL;

-- Hands the free capacity to waiting jobs, one at a time in the fair order (each grant changes
-- the order: the user's runs in use grow), numbering each with the lowest free token and claiming
-- its release for the caller (attempt counted, leased; its release window starts now; like every
-- release claim it carries a recorded cancel intent, and then the attempt cancels the run). Only ever
-- called under the fleet-wide capacity lock, so grants of two replicas never see the same free
-- capacity. Rows skipped while another transaction holds them (a cancel) wait for the next grant.
-- While the core refuses, the limit is what it last took plus one probe per probe interval.
-- Returns a 'granted' row per grant, then one 'state' row: whether the capacity is limited (a
-- replica keeps granting while it is), what is in use after the grants and the limit they used.
CREATE FUNCTION queue_grant_capacity(
    p_lease_seconds double precision,
    p_release_window_seconds double precision,
    p_probe_interval_seconds double precision,
    p_max_grants integer)
RETURNS TABLE (row_kind text, job_id uuid, user_id text, run_id uuid, release_attempts integer,
               waited_seconds double precision, probe boolean, limited boolean, in_use integer,
               capacity_limit integer, cancel_requested boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_settings queue_capacity%ROWTYPE;
    v_now constant timestamptz := clock_timestamp();
    v_limit integer;
    v_in_use integer;
    v_granted integer := 0;
    v_probe boolean;
    v_job record;
    v_token integer;
    v_attempts integer;
    v_turn_before timestamptz;
BEGIN
    SELECT * INTO v_settings FROM queue_capacity;
    IF v_settings.capacity > 0 THEN
        v_limit := v_settings.capacity;
    END IF;
    IF v_settings.core_limit IS NOT NULL THEN
        v_limit := least(coalesce(v_limit, 2147483647),
                         v_settings.core_limit
                         + CASE WHEN v_settings.next_probe_at IS NULL OR v_settings.next_probe_at <= v_now THEN 1 ELSE 0 END);
    END IF;
    v_in_use := queue_capacity_in_use();
    WHILE v_granted < p_max_grants AND (v_limit IS NULL OR v_in_use < v_limit) LOOP
        SELECT w.job_id, w.user_id, w.run_id, w.capacity_wait_since, w.cancel_requested_at INTO v_job
          FROM analysis_jobs w
          LEFT JOIN user_capacity_turns t ON t.user_id = w.user_id
         WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL
         ORDER BY queue_capacity_in_use_of_user(w.user_id), COALESCE(t.last_turn_at, w.capacity_wait_since),
                  w.capacity_wait_since, w.queue_seq
         LIMIT 1
           FOR UPDATE OF w SKIP LOCKED;
        EXIT WHEN NOT FOUND;
        SELECT min(s) INTO v_token
          FROM generate_series(1, v_in_use + 1) AS s
         WHERE NOT EXISTS (SELECT 1 FROM analysis_jobs h
                            WHERE h.capacity_token = s
                              AND (h.status IN ('pending', 'running') OR h.run_settle_due_at IS NOT NULL));
        v_probe := v_settings.core_limit IS NOT NULL AND v_in_use >= v_settings.core_limit;
        SELECT t.last_turn_at INTO v_turn_before FROM user_capacity_turns t WHERE t.user_id = v_job.user_id;
        INSERT INTO user_capacity_turns AS t (user_id, last_turn_at) VALUES (v_job.user_id, v_now)
        ON CONFLICT ON CONSTRAINT user_capacity_turns_pkey DO UPDATE SET last_turn_at = EXCLUDED.last_turn_at;
        UPDATE analysis_jobs a
           SET capacity_token = v_token,
               capacity_turn_before = v_turn_before,
               release_attempts = a.release_attempts + 1,
               next_release_at = v_now + make_interval(secs => p_lease_seconds),
               release_deadline = v_now + make_interval(secs => p_release_window_seconds)
         WHERE a.job_id = v_job.job_id
        RETURNING a.release_attempts INTO v_attempts;
        v_in_use := v_in_use + 1;
        v_granted := v_granted + 1;
        RETURN QUERY SELECT 'granted'::text, v_job.job_id, v_job.user_id, v_job.run_id, v_attempts,
                            extract(epoch FROM v_now - v_job.capacity_wait_since)::float8, v_probe, true, v_in_use, v_limit,
                            v_job.cancel_requested_at IS NOT NULL;
        IF v_probe THEN
            -- One release above what the core last took, then none until the next probe is due.
            UPDATE queue_capacity SET next_probe_at = v_now + make_interval(secs => p_probe_interval_seconds);
            EXIT;
        END IF;
    END LOOP;
    RETURN QUERY SELECT 'state'::text, NULL::uuid, NULL::text, NULL::uuid, NULL::integer, NULL::float8, NULL::boolean,
                        coalesce(v_settings.capacity > 0 OR v_settings.core_limit IS NOT NULL, false)
                        OR EXISTS (SELECT 1 FROM analysis_jobs w
                                    WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL),
                        v_in_use, v_limit, NULL::boolean;
END
$$;

-- The core answered a release RESOURCE_EXHAUSTED ("not now", nothing applied): the job gives its
-- capacity back and waits again with its place kept (its wait unchanged, its user's turn given
-- back),
-- no retry of its own and no release window running. The fleet learns the core's limit (what is
-- in use now) and probes above it at most once per probe interval. Fenced by the attempt that was
-- refused; returns the limit learned, or no row when fenced.
CREATE FUNCTION queue_capacity_refused(p_job_id uuid, p_attempt integer, p_probe_interval_seconds double precision)
RETURNS TABLE (row_kind text, core_limit integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_in_use integer;
    v_user_id text;
    v_turn_before timestamptz;
BEGIN
    UPDATE analysis_jobs a
       SET capacity_token = NULL,
           next_release_at = NULL,
           capacity_wait_since = COALESCE(a.capacity_wait_since, clock_timestamp())
     WHERE a.job_id = p_job_id AND a.status = 'pending' AND a.release_attempts = p_attempt
    RETURNING a.user_id, a.capacity_turn_before INTO v_user_id, v_turn_before;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- The turn was not taken: the user's turn is what it was before this grant.
    IF v_turn_before IS NULL THEN
        DELETE FROM user_capacity_turns t WHERE t.user_id = v_user_id;
    ELSE
        UPDATE user_capacity_turns t SET last_turn_at = v_turn_before WHERE t.user_id = v_user_id;
    END IF;
    v_in_use := queue_capacity_in_use();
    INSERT INTO queue_capacity AS c (capacity, core_limit, next_probe_at, core_refusals)
    VALUES (0, v_in_use, clock_timestamp() + make_interval(secs => p_probe_interval_seconds), 1)
    ON CONFLICT (singleton) DO UPDATE
       SET core_limit = least(COALESCE(c.core_limit, v_in_use), v_in_use),
           next_probe_at = clock_timestamp() + make_interval(secs => p_probe_interval_seconds),
           core_refusals = c.core_refusals + 1;
    RETURN QUERY SELECT 'refused'::text, c.core_limit FROM queue_capacity c;
END
$$;

-- The core took a release above the limit it had taught us: the limit grows by one (additive
-- increase), and is forgotten once it reaches the configured capacity.
CREATE FUNCTION queue_capacity_probe_taken() RETURNS void
LANGUAGE sql AS $$
    UPDATE queue_capacity
       SET core_limit = CASE WHEN capacity > 0 AND core_limit + 1 >= capacity THEN NULL ELSE core_limit + 1 END,
           next_probe_at = NULL
     WHERE core_limit IS NOT NULL
$$;

-- The job view gains whether the job waits for capacity, and since when (appended columns).
CREATE OR REPLACE VIEW analysis_job_views AS
SELECT j.job_id, j.user_id, j.run_id, j.status, j.delta_of_job_id, j.release_attempts, j.last_error,
       j.create_time, j.promote_time, j.start_time, j.end_time, j.price, j.queue_seq,
       CASE WHEN j.status = 'queued' THEN
            (SELECT count(*) FROM analysis_jobs q
              WHERE q.user_id = j.user_id AND q.status = 'queued' AND q.queue_seq <= j.queue_seq)
       ELSE 0 END AS queue_position,
       CASE WHEN j.status = 'queued' THEN
            COALESCE((SELECT q.job_id FROM analysis_jobs q
                       WHERE q.user_id = j.user_id AND q.status = 'queued' AND q.queue_seq < j.queue_seq
                       ORDER BY q.queue_seq DESC LIMIT 1),
                     (SELECT a.job_id FROM analysis_jobs a
                       WHERE a.user_id = j.user_id AND a.status IN ('pending', 'running') AND a.delta_of_job_id IS NULL
                       ORDER BY a.promote_time, a.queue_seq LIMIT 1))
       END AS waiting_for_job_id,
       CASE WHEN j.status = 'queued' THEN
            (SELECT min(COALESCE(a.start_time, a.promote_time)) FROM analysis_jobs a
              WHERE a.user_id = j.user_id AND a.status IN ('pending', 'running') AND a.delta_of_job_id IS NULL)
       END AS active_since,
       (SELECT l.max_active FROM user_queue_limits l WHERE l.user_id = j.user_id) AS max_active_override,
       COALESCE((SELECT true FROM credit_ledger r WHERE r.job_id = j.job_id AND r.kind = 'refund'), false) AS refunded,
       (j.status = 'pending' AND j.capacity_wait_since IS NOT NULL AND j.capacity_token IS NULL) AS waiting_for_capacity,
       j.capacity_wait_since
  FROM analysis_jobs j;
