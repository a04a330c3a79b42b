-- The fair order of jobs waiting for capacity, read from an index (docs/design.md, I13).
--
-- Migration 0014 ordered every waiting job by a count of its user's runs in use, computed per row
-- and sorted, on every grant: a grant cost grew with the number of jobs waiting (180 count
-- probes and a sort per grant at 200 users and a capacity of 20). The rule stays (max-min, then
-- round-robin), made index-driven and with two corrections (the turn and the runs in use below):
--
-- * `capacity_turn_key` on a waiting job is its user's place in the round-robin: since when she
--   has been waiting for her next turn, that is the later of when this job began to wait and her
--   latest turn (`user_capacity_turns`: her latest grant). 0014 took her latest turn whenever she
--   had one, so a user whose run had just ended ranked by when that run was granted, ahead of
--   users who had been waiting all along without a turn: the first wave of a saturated batch was
--   served twice before the rest once. A user joins the line at its end when her job begins to
--   wait (the trigger sets the key to that moment); a grant moves her other waiting jobs (several
--   slots) to the end; a refusal gives the turn back, keys included. The partial index
--   `analysis_jobs_capacity_turn_order` lists the waiting jobs in (key, wait, admission) order.
-- * Max-min comes first: a user with fewer first-pass runs taking capacity is served before one
--   with more. The grant walks the index in key order and counts each candidate's runs in use
--   (`queue_capacity_in_use_of_user`, one probe of the slot index); the first candidate with none
--   is the answer. With one slot per user (the default) a waiting user never has another run in
--   use, so a grant reads one index entry and one count, whatever the number waiting; only users
--   with several slots and runs in use are stepped over.
-- * The runs that rank a user are her first-pass runs that take capacity (granted or judging, or
--   ended with the run not yet settled): the ones I12 counts for her. Her delta re-checks take
--   capacity too, but do not change her rank: they never wait and are bounded on their own
--   (`QUEUE_MAX_ACTIVE_DELTAS_PER_USER`); a re-check of a finished job must not cost her first-pass
--   job its place.
-- * A job canceled while still queued, whose run the core has not yet confirmed canceled, is not
--   in use: its run was never released (it is held at the core, not judging). 0014 counted it,
--   for the user's rank and for the fleet: while such a cancel went unanswered, its user ranked
--   behind every user with no run in use, and another user could pass her twice. A run in use
--   is now one that was promoted into a slot (`slot IS NOT NULL`), as the slot index means it.
--
-- Additive: the column is new, the functions keep their signatures (replicas of the previous
-- version call the same functions and get the new order).

ALTER TABLE analysis_jobs ADD COLUMN capacity_turn_key timestamptz;

UPDATE analysis_jobs w
   SET capacity_turn_key = GREATEST((SELECT t.last_turn_at FROM user_capacity_turns t WHERE t.user_id = w.user_id), w.capacity_wait_since)
 WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL;

CREATE INDEX analysis_jobs_capacity_turn_order ON analysis_jobs (capacity_turn_key, capacity_wait_since, queue_seq)
 WHERE status = 'pending' AND capacity_wait_since IS NOT NULL AND capacity_token IS NULL;

-- First-pass runs of one user (or of every user) that take capacity: jobs promoted into one of
-- the user's slots and still holding it (PENDING, RUNNING, or ended with the run unsettled),
-- except those waiting for capacity. A job ended while queued never held a slot nor released its
-- run. The slot index (its own predicate) serves both.
CREATE OR REPLACE FUNCTION queue_capacity_in_use_of_user(p_user_id text) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT count(*)::integer FROM analysis_jobs a
     WHERE a.user_id = p_user_id
       AND (a.status IN ('pending', 'running') OR a.run_settle_due_at IS NOT NULL) AND a.delta_of_job_id IS NULL
       AND a.slot IS NOT NULL
       AND (a.capacity_wait_since IS NULL OR a.capacity_token IS NOT NULL)
$$;

-- Everything the core may be judging for us: first-pass runs in use (above), and delta re-checks
-- running or ended unsettled (deltas never wait, but they take the core's capacity).
CREATE OR REPLACE FUNCTION queue_capacity_in_use() RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT (SELECT count(*) FROM analysis_jobs a
             WHERE (a.status IN ('pending', 'running') OR a.run_settle_due_at IS NOT NULL) AND a.delta_of_job_id IS NULL
               AND a.slot IS NOT NULL
               AND (a.capacity_wait_since IS NULL OR a.capacity_token IS NOT NULL))::integer
         + (SELECT count(*) FROM analysis_jobs d
             WHERE d.status = 'running' AND d.delta_of_job_id IS NOT NULL)::integer
         + (SELECT count(*) FROM analysis_jobs u
             WHERE u.run_settle_due_at IS NOT NULL AND u.delta_of_job_id IS NOT NULL)::integer
$$;

-- As in 0014, and the job joins the round-robin at its end (its user's latest turn is older).
CREATE OR REPLACE FUNCTION analysis_jobs_wait_for_capacity() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_now constant timestamptz := clock_timestamp();
BEGIN
    IF (TG_OP = 'INSERT' OR OLD.status = 'queued')
       AND EXISTS (SELECT 1 FROM queue_capacity c WHERE c.capacity > 0 OR c.core_limit IS NOT NULL) THEN
        NEW.capacity_wait_since := v_now;
        NEW.capacity_turn_key := v_now;
        NEW.capacity_token := NULL;
        NEW.next_release_at := NULL;
        NEW.release_attempts := CASE WHEN TG_OP = 'INSERT' THEN 0 ELSE OLD.release_attempts END;
    END IF;
    RETURN NEW;
END
$$;

-- The fair order (positions shown to users): the grant's order, fewest runs in use first, then
-- the user who has waited longest for her next turn, then the job that waited longest.
CREATE OR REPLACE VIEW analysis_jobs_capacity_order AS
SELECT w.job_id, w.user_id, w.run_id, w.capacity_wait_since,
       row_number() OVER (ORDER BY queue_capacity_in_use_of_user(w.user_id),
                                   w.capacity_turn_key, w.capacity_wait_since, w.queue_seq) AS capacity_position
  FROM analysis_jobs w
 WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL;

-- The next job in the fair order, locked for the grant (NULL: none waits, or every candidate is
-- locked by another transaction, a cancel: it waits for the next grant). Walks the turn-order
-- index one entry at a time and stops at the first candidate whose user has no run in use.
CREATE FUNCTION queue_capacity_next_in_line() RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    v_row record;
    v_rank integer;
    v_best uuid;
    v_best_rank integer;
    v_skipped uuid[] := '{}';
BEGIN
    LOOP
        v_best := NULL;
        v_row := NULL;
        LOOP
            IF v_row IS NULL THEN
                SELECT w.job_id, w.user_id, w.capacity_turn_key, w.capacity_wait_since, w.queue_seq INTO v_row
                  FROM analysis_jobs w
                 WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL
                   AND w.job_id <> ALL (v_skipped)
                 ORDER BY w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
                 LIMIT 1;
            ELSE
                SELECT w.job_id, w.user_id, w.capacity_turn_key, w.capacity_wait_since, w.queue_seq INTO v_row
                  FROM analysis_jobs w
                 WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL
                   AND w.job_id <> ALL (v_skipped)
                   AND (w.capacity_turn_key, w.capacity_wait_since, w.queue_seq)
                       > (v_row.capacity_turn_key, v_row.capacity_wait_since, v_row.queue_seq)
                 ORDER BY w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
                 LIMIT 1;
            END IF;
            EXIT WHEN NOT FOUND;
            v_rank := queue_capacity_in_use_of_user(v_row.user_id);
            IF v_best IS NULL OR v_rank < v_best_rank THEN
                v_best := v_row.job_id;
                v_best_rank := v_rank;
            END IF;
            EXIT WHEN v_rank = 0;
        END LOOP;
        IF v_best IS NULL THEN
            RETURN NULL;
        END IF;
        PERFORM 1 FROM analysis_jobs w
          WHERE w.job_id = v_best AND w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL
            FOR UPDATE SKIP LOCKED;
        IF FOUND THEN
            RETURN v_best;
        END IF;
        -- Locked by another transaction (or changed meanwhile): the order without it.
        v_skipped := v_skipped || v_best;
    END LOOP;
END
$$;

-- As in 0014, with the next in line from `queue_capacity_next_in_line` and the user's other
-- waiting jobs moved behind every waiting user with the grant (their keys: the grant's time).
CREATE OR REPLACE FUNCTION queue_grant_capacity(
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
    v_job_id uuid;
    v_job record;
    v_token integer;
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
        v_job_id := queue_capacity_next_in_line();
        EXIT WHEN v_job_id IS NULL;
        SELECT min(s) INTO v_token
          FROM generate_series(1, v_in_use + 1) AS s
         WHERE NOT EXISTS (SELECT 1 FROM analysis_jobs h
                            WHERE h.capacity_token = s
                              AND (h.status IN ('pending', 'running') OR h.run_settle_due_at IS NOT NULL));
        v_probe := v_settings.core_limit IS NOT NULL AND v_in_use >= v_settings.core_limit;
        UPDATE analysis_jobs a
           SET capacity_token = v_token,
               capacity_turn_before = (SELECT t.last_turn_at FROM user_capacity_turns t WHERE t.user_id = a.user_id),
               capacity_turn_key = v_now,
               release_attempts = a.release_attempts + 1,
               next_release_at = v_now + make_interval(secs => p_lease_seconds),
               release_deadline = v_now + make_interval(secs => p_release_window_seconds)
         WHERE a.job_id = v_job_id
        RETURNING a.job_id, a.user_id, a.run_id, a.release_attempts, a.capacity_wait_since, a.cancel_requested_at INTO v_job;
        INSERT INTO user_capacity_turns AS t (user_id, last_turn_at) VALUES (v_job.user_id, v_now)
        ON CONFLICT ON CONSTRAINT user_capacity_turns_pkey DO UPDATE SET last_turn_at = EXCLUDED.last_turn_at;
        -- Her other waiting jobs (several slots) wait behind every user waiting now.
        UPDATE analysis_jobs o
           SET capacity_turn_key = v_now
         WHERE o.user_id = v_job.user_id AND o.status = 'pending' AND o.delta_of_job_id IS NULL
           AND o.capacity_wait_since IS NOT NULL AND o.capacity_token IS NULL AND o.capacity_turn_key < v_now;
        v_in_use := v_in_use + 1;
        v_granted := v_granted + 1;
        RETURN QUERY SELECT 'granted'::text, v_job.job_id, v_job.user_id, v_job.run_id, v_job.release_attempts,
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

-- As in 0014, and the keys of the user's waiting jobs go back with her turn.
CREATE OR REPLACE FUNCTION queue_capacity_refused(p_job_id uuid, p_attempt integer, p_probe_interval_seconds double precision)
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
    UPDATE analysis_jobs w
       SET capacity_turn_key = GREATEST(v_turn_before, w.capacity_wait_since)
     WHERE w.user_id = v_user_id AND w.status = 'pending' AND w.delta_of_job_id IS NULL
       AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL;
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
