-- Delta re-checks take turns under the fleet's capacity, and a refused release gives back only
-- its own turn (docs/design.md, I6, I12, I13).
--
-- Until now a delta never waited: its run was created judging, and it took capacity without a
-- turn. A user with a finished job and no credits could keep re-checking (deltas cost nothing by
-- default), hold the capacity above its limit and keep every other user's first-pass job waiting.
-- The rules now:
--
-- * A delta still never waits for its user's slot (deltas hold none, I6), but while the fleet's
--   capacity is limited its run is created held and the job is PENDING, waiting for a turn like
--   any run (`queue_admit_job` with `p_delta_held`; the capacity trigger now covers deltas). A
--   grant releases it. With the capacity unlimited a delta is created judging and admitted
--   RUNNING, as before.
-- * Every run a user has at the core counts toward her place in the max-min order, her deltas
--   included (`queue_capacity_in_use_of_user`), and the fleet's count is one rule for both kinds
--   (`queue_capacity_in_use`): a run takes capacity while PENDING, RUNNING or ended unsettled,
--   unless it waits for a grant. I12 holds for every run at the core.
-- * Among users with equally few runs in use, a waiting delta goes ahead of first-pass work
--   (`queue_capacity_next_in_line` walks the waiting deltas first); the positions shown
--   (`analysis_jobs_capacity_order`) follow the same order.
-- * A user's deltas waiting or judging count toward her delta limit (QUEUE_MAX_ACTIVE_DELTAS_PER_USER).
-- * A refused release (`queue_capacity_refused`) gives the user's turn back only while the turn
--   it took is still her latest: one she got meanwhile through another slot is kept (it used to
--   be erased, passing her ahead of users she had already been served before).
--
-- Additive for the replicas of the previous version that overlap a deploy: every function keeps
-- its signature and result; `queue_admit_job` gains an overload with `p_delta_held`, and the one
-- the previous version calls admits deltas judging, as it always did.

CREATE INDEX analysis_jobs_deltas_taking_capacity ON analysis_jobs (user_id)
 WHERE (status IN ('pending', 'running') OR run_settle_due_at IS NOT NULL) AND delta_of_job_id IS NOT NULL
   AND (capacity_wait_since IS NULL OR capacity_token IS NOT NULL);

CREATE INDEX analysis_jobs_active_deltas ON analysis_jobs (user_id)
 WHERE status IN ('pending', 'running') AND delta_of_job_id IS NOT NULL;

CREATE INDEX analysis_jobs_deltas_waiting_turn_order ON analysis_jobs (capacity_turn_key, capacity_wait_since, queue_seq)
 WHERE status = 'pending' AND capacity_wait_since IS NOT NULL AND capacity_token IS NULL AND delta_of_job_id IS NOT NULL;

-- A user's runs that take capacity: first-pass runs promoted into a slot and deltas, PENDING,
-- RUNNING or ended with the run unsettled, except those waiting for a grant. Each half is read
-- through the partial index whose predicate it spells word for word.
CREATE OR REPLACE FUNCTION queue_capacity_in_use_of_user(p_user_id text) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT (SELECT count(*) FROM analysis_jobs a
             WHERE a.user_id = p_user_id
               AND (a.status IN ('pending', 'running') OR a.run_settle_due_at IS NOT NULL) AND a.delta_of_job_id IS NULL
               AND a.slot IS NOT NULL
               AND (a.capacity_wait_since IS NULL OR a.capacity_token IS NOT NULL))::integer
         + (SELECT count(*) FROM analysis_jobs d
             WHERE d.user_id = p_user_id
               AND (d.status IN ('pending', 'running') OR d.run_settle_due_at IS NOT NULL) AND d.delta_of_job_id IS NOT NULL
               AND (d.capacity_wait_since IS NULL OR d.capacity_token IS NOT NULL))::integer
$$;

-- Everything the core may be judging for us, by the same rule for every user.
CREATE OR REPLACE FUNCTION queue_capacity_in_use() RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT (SELECT count(*) FROM analysis_jobs a
             WHERE (a.status IN ('pending', 'running') OR a.run_settle_due_at IS NOT NULL) AND a.delta_of_job_id IS NULL
               AND a.slot IS NOT NULL
               AND (a.capacity_wait_since IS NULL OR a.capacity_token IS NOT NULL))::integer
         + (SELECT count(*) FROM analysis_jobs d
             WHERE (d.status IN ('pending', 'running') OR d.run_settle_due_at IS NOT NULL) AND d.delta_of_job_id IS NOT NULL
               AND (d.capacity_wait_since IS NULL OR d.capacity_token IS NOT NULL))::integer
$$;

-- A PENDING job of either kind waits for a grant while the capacity is limited (the function is
-- 0016's; only the trigger's condition changes: deltas too).
DROP TRIGGER analysis_jobs_wait_for_capacity ON analysis_jobs;
CREATE TRIGGER analysis_jobs_wait_for_capacity BEFORE INSERT OR UPDATE OF status ON analysis_jobs
FOR EACH ROW WHEN (NEW.status = 'pending') EXECUTE FUNCTION analysis_jobs_wait_for_capacity();

-- The waiting job that would be served first among those of one kind (`p_deltas_only`) or of
-- both, and its user's runs in use: the first in turn order whose user has the fewest runs in use,
-- considering only users with fewer than `p_rank_to_beat` (NULL: any). Walks the turn-order index
-- one entry at a time and stops at a user with none in use.
CREATE FUNCTION queue_capacity_first_waiting(p_deltas_only boolean, p_skipped uuid[], p_rank_to_beat integer)
RETURNS TABLE(job_id uuid, runs_in_use integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_job_id uuid;
    v_user_id text;
    v_key timestamptz;
    v_wait timestamptz;
    v_seq bigint;
    v_rank integer;
BEGIN
    job_id := NULL;
    runs_in_use := p_rank_to_beat;
    LOOP
        -- The next waiting job after (v_key, v_wait, v_seq) in turn order, each query spelled so
        -- that its partial index serves it.
        IF p_deltas_only AND v_job_id IS NULL THEN
            SELECT w.job_id, w.user_id, w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
              INTO v_job_id, v_user_id, v_key, v_wait, v_seq
              FROM analysis_jobs w
             WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL
               AND w.delta_of_job_id IS NOT NULL AND w.job_id <> ALL (p_skipped)
             ORDER BY w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
             LIMIT 1;
        ELSIF p_deltas_only THEN
            SELECT w.job_id, w.user_id, w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
              INTO v_job_id, v_user_id, v_key, v_wait, v_seq
              FROM analysis_jobs w
             WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL
               AND w.delta_of_job_id IS NOT NULL AND w.job_id <> ALL (p_skipped)
               AND (w.capacity_turn_key, w.capacity_wait_since, w.queue_seq) > (v_key, v_wait, v_seq)
             ORDER BY w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
             LIMIT 1;
        ELSIF v_job_id IS NULL THEN
            SELECT w.job_id, w.user_id, w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
              INTO v_job_id, v_user_id, v_key, v_wait, v_seq
              FROM analysis_jobs w
             WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL
               AND w.job_id <> ALL (p_skipped)
             ORDER BY w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
             LIMIT 1;
        ELSE
            SELECT w.job_id, w.user_id, w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
              INTO v_job_id, v_user_id, v_key, v_wait, v_seq
              FROM analysis_jobs w
             WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL
               AND w.job_id <> ALL (p_skipped)
               AND (w.capacity_turn_key, w.capacity_wait_since, w.queue_seq) > (v_key, v_wait, v_seq)
             ORDER BY w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
             LIMIT 1;
        END IF;
        EXIT WHEN NOT FOUND;
        v_rank := queue_capacity_in_use_of_user(v_user_id);
        IF runs_in_use IS NULL OR v_rank < runs_in_use THEN
            job_id := v_job_id;
            runs_in_use := v_rank;
        END IF;
        EXIT WHEN v_rank = 0;
    END LOOP;
    IF job_id IS NOT NULL THEN
        RETURN NEXT;
    END IF;
END
$$;

-- The next job in the fair order, locked for the grant (NULL: none waits, or every candidate is
-- locked by another transaction): fewest runs in use first and, among users with equally few, a
-- delta ahead of first-pass work; then the user who has waited longest for her turn.
CREATE OR REPLACE FUNCTION queue_capacity_next_in_line() RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    v_delta record;
    v_first_pass record;
    v_best uuid;
    v_locked record;
    v_skipped uuid[] := '{}';
BEGIN
    LOOP
        SELECT f.job_id, f.runs_in_use INTO v_delta FROM queue_capacity_first_waiting(true, v_skipped, NULL) f;
        v_best := v_delta.job_id;
        IF v_best IS NULL OR v_delta.runs_in_use > 0 THEN
            -- Anyone with strictly fewer runs in use goes ahead of the delta.
            SELECT f.job_id, f.runs_in_use INTO v_first_pass
              FROM queue_capacity_first_waiting(false, v_skipped, v_delta.runs_in_use) f;
            v_best := COALESCE(v_first_pass.job_id, v_best);
        END IF;
        IF v_best IS NULL THEN
            RETURN NULL;
        END IF;
        SELECT w.status, w.capacity_wait_since, w.capacity_token INTO v_locked
          FROM analysis_jobs w
         WHERE w.job_id = v_best
           FOR UPDATE SKIP LOCKED;
        IF FOUND AND v_locked.status = 'pending' AND v_locked.capacity_wait_since IS NOT NULL
           AND v_locked.capacity_token IS NULL THEN
            RETURN v_best;
        END IF;
        -- Locked by another transaction (or changed meanwhile): the order without it.
        v_skipped := v_skipped || v_best;
    END LOOP;
END
$$;

-- The fair order (positions shown to users), as the grant serves it.
CREATE OR REPLACE VIEW analysis_jobs_capacity_order AS
SELECT w.job_id, w.user_id, w.run_id, w.capacity_wait_since,
       row_number() OVER (ORDER BY queue_capacity_in_use_of_user(w.user_id), w.delta_of_job_id IS NULL,
                                   w.capacity_turn_key, w.capacity_wait_since, w.queue_seq) AS capacity_position
  FROM analysis_jobs w
 WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL;

-- As in 0014/0016; a grant moves all of the user's other waiting jobs, deltas included, behind
-- every user waiting now.
CREATE OR REPLACE FUNCTION queue_grant_capacity(p_lease_seconds double precision, p_release_window_seconds double precision,
                                                p_probe_interval_seconds double precision, p_max_grants integer)
RETURNS TABLE(row_kind text, job_id uuid, user_id text, run_id uuid, release_attempts integer, waited_seconds double precision,
              probe boolean, limited boolean, in_use integer, capacity_limit integer, cancel_requested boolean)
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
        -- Her other waiting jobs (several slots, re-checks) wait behind every user waiting now.
        UPDATE analysis_jobs o
           SET capacity_turn_key = v_now
         WHERE o.user_id = v_job.user_id AND o.status = 'pending'
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

-- A grant given back (the core's "not now", or a job taken back to its queue): the user's turn
-- goes back to what it was before that grant (`p_turn_before`) only while the turn the grant gave
-- her (`p_turn_granted`, the granted job's turn key) is still her latest, so one she got meanwhile
-- through another slot is kept; her waiting jobs then wait from her latest turn.
CREATE FUNCTION queue_capacity_give_back_turn(p_user_id text, p_turn_before timestamptz, p_turn_granted timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_turn_now timestamptz;
BEGIN
    IF p_turn_before IS NULL THEN
        DELETE FROM user_capacity_turns t WHERE t.user_id = p_user_id AND t.last_turn_at = p_turn_granted;
    ELSE
        UPDATE user_capacity_turns t SET last_turn_at = p_turn_before
         WHERE t.user_id = p_user_id AND t.last_turn_at = p_turn_granted;
    END IF;
    SELECT t.last_turn_at INTO v_turn_now FROM user_capacity_turns t WHERE t.user_id = p_user_id;
    UPDATE analysis_jobs w
       SET capacity_turn_key = GREATEST(v_turn_now, w.capacity_wait_since)
     WHERE w.user_id = p_user_id AND w.status = 'pending'
       AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL;
END
$$;

-- The core answered a granted release "not now": the job waits again with its place (its turn
-- given back), and the fleet learns the core's limit.
CREATE OR REPLACE FUNCTION queue_capacity_refused(p_job_id uuid, p_attempt integer, p_probe_interval_seconds double precision)
RETURNS TABLE(row_kind text, core_limit integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_in_use integer;
    v_user_id text;
    v_turn_before timestamptz;
    v_turn_granted timestamptz;
BEGIN
    UPDATE analysis_jobs a
       SET capacity_token = NULL,
           next_release_at = NULL,
           capacity_wait_since = COALESCE(a.capacity_wait_since, clock_timestamp())
     WHERE a.job_id = p_job_id AND a.status = 'pending' AND a.release_attempts = p_attempt
    RETURNING a.user_id, a.capacity_turn_before, a.capacity_turn_key INTO v_user_id, v_turn_before, v_turn_granted;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM queue_capacity_give_back_turn(v_user_id, v_turn_before, v_turn_granted);
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

-- The locked admit, deciding a delta's placement by whether its run was created held
-- (`p_delta_held`: the fleet's capacity was limited when the admit looked). A held delta is
-- PENDING with its first release claimed (the capacity trigger makes it wait for a grant while
-- the capacity is limited), one created judging is RUNNING. Waiting and judging deltas count
-- toward the user's delta limit.
CREATE FUNCTION queue_admit_job(p_job_id uuid, p_user_id text, p_run_id uuid, p_idempotency_key text, p_request_digest bytea,
                                p_delta_of_job_id uuid, p_price integer, p_actor text, p_reason text,
                                p_default_max_active integer, p_max_queued integer, p_max_running_deltas integer,
                                p_release_window_seconds double precision, p_release_lease_seconds double precision,
                                p_reconcile_after_seconds double precision, p_document_uri text, p_document_title text,
                                p_sources jsonb, p_delta_held boolean)
RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
LANGUAGE plpgsql AS $$
DECLARE
    v_is_delta constant boolean := p_delta_of_job_id IS NOT NULL;
    v_delta_judging constant boolean := p_delta_of_job_id IS NOT NULL AND NOT p_delta_held;
    v_delta_held constant boolean := p_delta_of_job_id IS NOT NULL AND p_delta_held;
    v_admitted uuid;
BEGIN
    WITH reservation AS (
        SELECT r.run_id FROM run_reservations r
         WHERE r.run_id = p_run_id AND NOT r.canceling
           FOR UPDATE
    ),
    queue AS (
        -- The user's queue length, counted once: it decides the placement and guards the cap.
        SELECT CASE WHEN v_is_delta THEN 0 ELSE (SELECT count(*) FROM analysis_jobs q
                                                   WHERE q.user_id = p_user_id AND q.status = 'queued') END AS queued
    ),
    placement AS (
        SELECT clock_timestamp() AS now,
               queue.queued,
               CASE
                   WHEN v_is_delta OR queue.queued > 0 THEN NULL
                   ELSE analysis_jobs_free_slot(p_user_id, p_default_max_active)
               END AS slot
          FROM queue
    ),
    inserted AS (
        INSERT INTO analysis_jobs (
            job_id, user_id, run_id, idempotency_key, request_digest, status, queue_seq, slot,
            delta_of_job_id, price, create_time, promote_time, next_release_at, release_attempts,
            release_deadline, start_time, next_reconcile_at,
            document_uri, document_title, sources, source_count, sources_preview)
        SELECT p_job_id, p_user_id, p_run_id, p_idempotency_key, p_request_digest,
               CASE WHEN v_delta_judging THEN 'running' WHEN v_delta_held OR pl.slot IS NOT NULL THEN 'pending' ELSE 'queued' END,
               nextval('analysis_jobs_queue_seq'),
               pl.slot,
               p_delta_of_job_id,
               p_price,
               pl.now,
               CASE WHEN v_is_delta OR pl.slot IS NOT NULL THEN pl.now END,
               CASE WHEN v_delta_held OR pl.slot IS NOT NULL THEN pl.now + make_interval(secs => p_release_lease_seconds) END,
               CASE WHEN v_delta_held OR pl.slot IS NOT NULL THEN 1 ELSE 0 END,
               CASE WHEN v_delta_held OR pl.slot IS NOT NULL THEN pl.now + make_interval(secs => p_release_window_seconds) END,
               CASE WHEN v_delta_judging THEN pl.now END,
               CASE WHEN v_delta_judging THEN pl.now + make_interval(secs => p_reconcile_after_seconds) END,
               p_document_uri, p_document_title, p_sources, jsonb_array_length(p_sources),
               (SELECT jsonb_agg(jsonb_build_object('doi', s.e->>'doi', 'citation', left(s.e->>'citation', 512)) ORDER BY s.n)
                  FROM jsonb_array_elements(p_sources) WITH ORDINALITY AS s(e, n)
                 WHERE s.n <= 10)
          FROM placement pl, reservation r
         WHERE (p_price = 0 OR EXISTS (SELECT 1 FROM credit_accounts c
                                        WHERE c.user_id = p_user_id AND c.balance >= p_price))
           AND (v_is_delta OR pl.queued < p_max_queued)
           AND (NOT v_is_delta OR (SELECT count(*) FROM analysis_jobs d
                                    WHERE d.user_id = p_user_id AND d.status IN ('pending', 'running')
                                      AND d.delta_of_job_id IS NOT NULL) < p_max_running_deltas)
        ON CONFLICT (user_id, idempotency_key) DO NOTHING
        RETURNING analysis_jobs.job_id, analysis_jobs.user_id, analysis_jobs.price
    ),
    consumed AS (
        DELETE FROM run_reservations r WHERE r.run_id = p_run_id AND EXISTS (SELECT 1 FROM inserted)
    ),
    debit AS (
        -- Under the user lock nothing else lowers this balance; its CHECK (balance >= 0) is the backstop.
        UPDATE credit_accounts c
           SET balance = c.balance - i.price, updated_at = clock_timestamp()
          FROM inserted i
         WHERE c.user_id = i.user_id AND i.price > 0
    ),
    charge AS (
        INSERT INTO credit_ledger (user_id, kind, amount, job_id, actor, reason)
        SELECT i.user_id, 'charge', -i.price, i.job_id, p_actor, p_reason FROM inserted i WHERE i.price > 0
    )
    SELECT i.job_id INTO v_admitted FROM inserted i;
    IF v_admitted IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT 'admitted'::text, 0, false, v FROM analysis_job_views v WHERE v.job_id = v_admitted;
END
$$;

-- The previous version's admit: its deltas are created judging.
CREATE OR REPLACE FUNCTION queue_admit_job(p_job_id uuid, p_user_id text, p_run_id uuid, p_idempotency_key text, p_request_digest bytea,
                                           p_delta_of_job_id uuid, p_price integer, p_actor text, p_reason text,
                                           p_default_max_active integer, p_max_queued integer, p_max_running_deltas integer,
                                           p_release_window_seconds double precision, p_release_lease_seconds double precision,
                                           p_reconcile_after_seconds double precision, p_document_uri text, p_document_title text,
                                           p_sources jsonb)
RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
LANGUAGE sql AS $$
    SELECT * FROM queue_admit_job(p_job_id, p_user_id, p_run_id, p_idempotency_key, p_request_digest, p_delta_of_job_id,
                                  p_price, p_actor, p_reason, p_default_max_active, p_max_queued, p_max_running_deltas,
                                  p_release_window_seconds, p_release_lease_seconds, p_reconcile_after_seconds,
                                  p_document_uri, p_document_title, p_sources, false)
$$;
