-- queue_adopt_run_v2: the function, the adoption the service calls (the named query adopt_run).
-- requires: analysis_job_views, queue_seat_on_entry
--
-- The whole placement is here: a job it adopts PENDING (a held run, or a held delta) takes its
-- place at the capacity from queue_seat_on_entry in the INSERT (it waits for a grant while the
-- capacity is limited or its releases are paused), and the lineage is the caller's parameter.
--
-- Why, migration by migration (its text below is the last one's; 0018-0024
-- wrote it as queue_adopt_run; 0039: the seat from queue_seat_on_entry, where the trigger
-- analysis_jobs_wait_for_capacity set it):
-- * 0018 (core runs adopted after failover): A locked section (the user's queue lock,
--   `locks.locked_section`): adopts a run the core holds or judges into a job, unless the queue
--   knows it after all. Idempotent across replicas: the run id and the (user, idempotency key) are
--   unique, and the checks and the insert run under the lock. Rows: 'adopted' with the new job's
--   view; 'known' (a job owns the run) with its view; 'reserved' (an admit is still in flight with
--   it); 'key_taken' (another job holds the click's key) with that job's view; 'delta_base_lost' (a
--   delta whose base job is gone); 'balance_short'. A judging first-pass run is adopted RUNNING
--   holding a slot: a free one, or one past the user's limit when the new primary gave hers to
--   another job meanwhile (the core does judge both), so no further job of hers is released until
--   both have settled (I9). A judging delta is adopted RUNNING (deltas hold no slot). A held run is
--   placed like an admit: QUEUED behind her queue, or PENDING with its first release due at once
--   when a slot is free (any dispatcher claims it).
-- * 0019 (adopt judging runs with stale reservations): The admit's reservation statement writes it
--   (no column default: a default calling a function of ours would make the schema depend on the
--   order its objects are created in). A reservation an older replica writes during a rolling
--   deploy has none: it is canceled as before, never adopted.
-- * 0024 (adopted judging run takes back unreleased jobs): As in 0019; a judging first-pass run
--   takes back the user's unreleased jobs before it takes a slot past her limit, and the jobs taken
--   back follow the adopted one as 'taken_back' rows.
-- * 0038 (retry lineage from its writer): 0024's adoption under a new name, with the job the
--   adopted job retries as a parameter (`p_retry_of_job_id`: the caller reads it from the key the
--   core's record kept, `model.retried_job_id`; NULL for a run no retry created), written by the
--   INSERT itself instead of by the trigger analysis_jobs_retry_lineage. A new name for the same
--   reason as queue_admit_job_v2's.

CREATE OR REPLACE FUNCTION public.queue_adopt_run_v2(p_job_id uuid, p_user_id text, p_run_id uuid, p_idempotency_key text, p_request_digest bytea, p_delta_of_run_id uuid, p_price bigint, p_judging boolean, p_actor text, p_reason text, p_default_max_active integer, p_release_window_seconds double precision, p_release_lease_seconds double precision, p_reconcile_after_seconds double precision, p_retry_of_job_id uuid)
 RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_existing uuid;
    v_base uuid;
    v_slot integer;
    v_status text;
    v_taken_back uuid[] := '{}';
    v_now timestamptz := clock_timestamp();
BEGIN
    SELECT j.job_id INTO v_existing FROM analysis_jobs j WHERE j.run_id = p_run_id;
    IF v_existing IS NOT NULL THEN
        RETURN QUERY SELECT 'known'::text, 0, false, v FROM analysis_job_views v WHERE v.job_id = v_existing;
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM run_reservations r WHERE r.run_id = p_run_id) THEN
        -- A judging first-pass run: its admit did commit, on a database that lost it. A claimed
        -- reservation from an earlier timeline: its admit ran on a primary a failover replaced.
        IF NOT ((p_judging AND p_delta_of_run_id IS NULL)
                OR EXISTS (SELECT 1 FROM run_reservations r
                            WHERE r.run_id = p_run_id AND r.canceling AND r.timeline_id < queue_current_timeline())) THEN
            RETURN QUERY SELECT 'reserved'::text, 0, false, NULL::analysis_job_views;
            RETURN;
        END IF;
        DELETE FROM run_reservations r WHERE r.run_id = p_run_id;
    END IF;
    SELECT j.job_id INTO v_existing FROM analysis_jobs j
     WHERE (j.user_id = p_user_id AND j.idempotency_key = p_idempotency_key) OR j.job_id = p_job_id
     LIMIT 1;
    IF v_existing IS NOT NULL THEN
        RETURN QUERY SELECT 'key_taken'::text, 0, false, v FROM analysis_job_views v WHERE v.job_id = v_existing;
        RETURN;
    END IF;
    IF p_delta_of_run_id IS NOT NULL THEN
        SELECT b.job_id INTO v_base FROM analysis_jobs b WHERE b.run_id = p_delta_of_run_id AND b.user_id = p_user_id;
        IF v_base IS NULL THEN
            RETURN QUERY SELECT 'delta_base_lost'::text, 0, false, NULL::analysis_job_views;
            RETURN;
        END IF;
    END IF;
    IF p_price > 0 AND NOT EXISTS (SELECT 1 FROM credit_accounts c WHERE c.user_id = p_user_id AND c.balance >= p_price) THEN
        RETURN QUERY SELECT 'balance_short'::text, 0, false, NULL::analysis_job_views;
        RETURN;
    END IF;

    IF v_base IS NOT NULL THEN
        -- A re-check the core holds waits for its turn while the capacity is limited (0023).
        v_status := CASE WHEN p_judging THEN 'running' ELSE 'pending' END;
    ELSIF p_judging THEN
        v_status := 'running';
        -- The core judges this run: the user's jobs it has not been asked to judge give way.
        SELECT coalesce(array_agg(t.job_id), '{}') INTO v_taken_back
          FROM queue_take_back_unreleased_jobs(p_user_id, p_default_max_active) AS t(job_id);
        v_slot := COALESCE(analysis_jobs_free_slot(p_user_id, p_default_max_active),
                           (SELECT COALESCE(max(h.slot), 0) + 1 FROM analysis_jobs h
                             WHERE h.user_id = p_user_id AND h.delta_of_job_id IS NULL AND h.slot IS NOT NULL
                               AND (h.status IN ('pending', 'running') OR h.run_settle_due_at IS NOT NULL)));
    ELSE
        IF NOT EXISTS (SELECT 1 FROM analysis_jobs q WHERE q.user_id = p_user_id AND q.status = 'queued') THEN
            v_slot := analysis_jobs_free_slot(p_user_id, p_default_max_active);
        END IF;
        v_status := CASE WHEN v_slot IS NULL THEN 'queued' ELSE 'pending' END;
    END IF;

    INSERT INTO analysis_jobs (
        job_id, user_id, run_id, idempotency_key, request_digest, status, queue_seq, slot,
        delta_of_job_id, price, create_time, promote_time, next_release_at, release_attempts,
        capacity_wait_since, capacity_turn_key, release_deadline, start_time, next_reconcile_at, retry_of_job_id)
    SELECT
        p_job_id, p_user_id, p_run_id, p_idempotency_key, p_request_digest, v_status,
        nextval('analysis_jobs_queue_seq'), v_slot, v_base, p_price, v_now,
        CASE WHEN v_status <> 'queued' THEN v_now END,
        seat.next_release_at,
        seat.release_attempts,
        seat.capacity_wait_since,
        seat.capacity_turn_key,
        CASE WHEN v_status = 'pending' THEN v_now + make_interval(secs => p_release_window_seconds) END,
        CASE WHEN v_status = 'running' THEN v_now END,
        CASE WHEN v_status = 'running' THEN v_now + make_interval(secs => p_reconcile_after_seconds) END,
        p_retry_of_job_id
      -- A PENDING job is due at once, for any replica's dispatcher, unless it waits for a grant.
      FROM queue_seat_on_entry(p_user_id, v_status = 'pending', v_now,
                               CASE WHEN v_status = 'pending' THEN v_now END, 0) AS seat;
    IF p_price > 0 THEN
        -- Under the user lock nothing else lowers this balance; its CHECK (balance >= 0) is the backstop.
        UPDATE credit_accounts c SET balance = c.balance - p_price, updated_at = clock_timestamp()
         WHERE c.user_id = p_user_id;
        INSERT INTO credit_ledger (user_id, kind, amount, job_id, actor, reason)
        VALUES (p_user_id, 'charge', -p_price, p_job_id, p_actor, p_reason);
    END IF;
    RETURN QUERY SELECT 'adopted'::text, 0, false, v FROM analysis_job_views v WHERE v.job_id = p_job_id;
    RETURN QUERY SELECT 'taken_back'::text, 0, false, v
                   FROM analysis_job_views v WHERE v.job_id = ANY (v_taken_back) ORDER BY v.queue_seq;
END
$function$;
