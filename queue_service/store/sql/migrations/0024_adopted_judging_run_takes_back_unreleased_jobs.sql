-- An adopted judging run keeps the user's other first-pass work from the core, in the database.
--
-- After an asynchronous failover the new primary gives the slot of a job it lost to the user's
-- next click, while the core still judges the lost job's run. Reconciliation adopts that run
-- RUNNING, past her limit when no slot is free. Until now only the release gate held the new
-- job back, by asking the core; once the history is recorded as reconciled (migration 0021)
-- releases stop asking, and the new job, still PENDING in its slot, was released beside the
-- adopted run (I9 broken at the core).
--
-- Now the adoption itself makes room: when no slot is free for the judging run it adopts, it
-- takes the user's PENDING first-pass jobs back to the queue, newest first, until one is: no
-- release of theirs has been confirmed, and the newest are those the new primary admitted or
-- promoted, whose releases the core's judging of the lost run held back. The slot accounting
-- (every promotion asks `analysis_jobs_free_slot`) then keeps them QUEUED until the adopted
-- run settles, whatever the history's record says and whichever road would release them (the
-- dispatcher's claim, a hand-over, a grant, `Release`, an owed release: each releases only
-- PENDING jobs). A taken-back job keeps its place (its `queue_seq`, older than every job still
-- queued, so it is promoted first) and its release window restarts at that promotion: a long
-- adopted run does not make it fail. Its status change fences out every statement of a release
-- claimed before (they are all fenced by `status = 'pending'`); a grant it held is given back
-- with its user's turn, as a refusal gives it back (migration 0016). A job whose user asked to
-- cancel stays: it is never released, only canceled.
--
-- A release in flight when its job is taken back: on a history not yet recorded it asked the
-- core first, which showed the adopted run judging (it judged before this history began), so it
-- holds back. On a recorded history a judging run is adopted only for a completion (the run has
-- finished: nothing judges beside it), and the completion that follows promotes the job again.
--
-- A re-check the core still holds (created held under a limited capacity, migration 0023) is
-- adopted PENDING, so it waits for its turn like any other, rather than RUNNING.
--
-- Additive: `queue_adopt_run` keeps its signature and its first row; the jobs taken back follow
-- as 'taken_back' rows, which a replica of the previous version does not read.

CREATE FUNCTION queue_take_back_unreleased_jobs(p_user_id text, p_default_max_active integer)
RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_job record;
BEGIN
    WHILE analysis_jobs_free_slot(p_user_id, p_default_max_active) IS NULL LOOP
        SELECT p.job_id, p.capacity_token, p.capacity_turn_before, p.capacity_turn_key INTO v_job
          FROM analysis_jobs p
         WHERE p.user_id = p_user_id AND p.status = 'pending' AND p.delta_of_job_id IS NULL
           AND p.cancel_requested_at IS NULL
         ORDER BY p.queue_seq DESC
         LIMIT 1
           FOR UPDATE;
        EXIT WHEN NOT FOUND;
        UPDATE analysis_jobs j
           SET status = 'queued',
               slot = NULL,
               promote_time = NULL,
               next_release_at = NULL,
               release_deadline = NULL,
               release_attempts = 0,
               capacity_wait_since = NULL,
               capacity_token = NULL,
               capacity_turn_before = NULL,
               capacity_turn_key = NULL
         WHERE j.job_id = v_job.job_id;
        IF v_job.capacity_token IS NOT NULL THEN
            -- Its grant is given back, and the turn with it (as `queue_capacity_refused` does).
            PERFORM queue_capacity_give_back_turn(p_user_id, v_job.capacity_turn_before, v_job.capacity_turn_key);
        END IF;
        RETURN NEXT v_job.job_id;
    END LOOP;
END
$$;

-- As in 0019; a judging first-pass run takes back the user's unreleased jobs before it takes a
-- slot past her limit, and the jobs taken back follow the adopted one as 'taken_back' rows.
CREATE OR REPLACE FUNCTION queue_adopt_run(
    p_job_id uuid, p_user_id text, p_run_id uuid, p_idempotency_key text, p_request_digest bytea,
    p_delta_of_run_id uuid, p_price bigint, p_judging boolean, p_actor text, p_reason text,
    p_default_max_active integer, p_release_window_seconds double precision,
    p_release_lease_seconds double precision, p_reconcile_after_seconds double precision)
RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
LANGUAGE plpgsql VOLATILE AS $$
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
        release_deadline, start_time, next_reconcile_at)
    VALUES (
        p_job_id, p_user_id, p_run_id, p_idempotency_key, p_request_digest, v_status,
        nextval('analysis_jobs_queue_seq'), v_slot, v_base, p_price, v_now,
        CASE WHEN v_status <> 'queued' THEN v_now END,
        CASE WHEN v_status = 'pending' THEN v_now END,  -- due at once, for any replica's dispatcher
        0,
        CASE WHEN v_status = 'pending' THEN v_now + make_interval(secs => p_release_window_seconds) END,
        CASE WHEN v_status = 'running' THEN v_now END,
        CASE WHEN v_status = 'running' THEN v_now + make_interval(secs => p_reconcile_after_seconds) END);
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
$$;
