-- A first-pass run judges only after its job committed (the admit's commit consumes the run's
-- reservation and claims the first release). So after a failover, a first-pass run the core
-- judges with a reservation but no job on the new primary is an admit that committed, was
-- acknowledged and was released on the old primary, and whose commit the new primary lost: only
-- the reservation, written before CreateRun, had reached the standby. It is adopted like any lost
-- job (the reservation consumed), never taken for an admit still in flight: before, the release
-- gate did not count it (a user's next run was released while it judged, I9) and the sweeper
-- canceled it when the reservation's grace ran out (an acknowledged click lost, its judging
-- thrown away).
--
-- A held run whose reservation outlived its lost job is told apart by the timeline: each
-- reservation records the timeline of the primary that wrote it. Once the reservation is claimed
-- for canceling (its grace over, or its admit's own clean-up: no admit can commit it any more)
-- and it was written on an earlier timeline than the current one, its admit ran on a primary a
-- failover replaced: it committed there (acknowledged) or answered an error the client retries
-- with the same key, which then finds the adopted job. Such a run is adopted rather than
-- canceled. A reservation of the current timeline is canceled as before (an admit that failed, I5).
CREATE FUNCTION queue_current_timeline() RETURNS integer
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN pg_is_in_recovery() THEN (SELECT timeline_id FROM pg_control_checkpoint())
                ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int
           END
$$;
ALTER TABLE run_reservations ADD COLUMN timeline_id integer;
-- The admit's reservation statement writes it (no column default: a default calling a function
-- of ours would make the schema depend on the order its objects are created in). A reservation
-- an older replica writes during a rolling deploy has none: it is canceled as before, never adopted.
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
        v_status := 'running';
    ELSIF p_judging THEN
        v_status := 'running';
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
END
$$;
