-- Every locked section as one statement (docs/scaling.md §1). The store sends the user's queue
-- lock and the section's call as one autocommit statement: `store/locks.py` wraps the call so the
-- lock is granted before the call starts, and each function here is VOLATILE PL/pgSQL, so every
-- statement inside it reads a snapshot taken after the lock was granted. No BEGIN, no COMMIT, no
-- separate view read: the statement is the transaction, and it returns what the caller answers
-- with. These functions take no lock of their own and are only ever called under the user lock.
--
-- Each returns rows of one shape: the kind of row, the refunded amount, whether the job's run is
-- still unsettled, and the job's view (`analysis_job_views`, read after the section's changes).
-- Additive: the functions of migration 0008 and the statements of earlier replicas keep working.

-- Admits a job: inserts it, debits its price and writes the charge, deciding its status in the
-- INSERT ('pending' with a slot when a slot is free and nobody is queued ahead, else 'queued'; a
-- delta starts 'running' and never takes a slot). A 'pending' job's first release is claimed for
-- the calling replica at once (attempt 1, leased). The run's reservation is consumed; one the
-- sweeper has started to cancel fences the insert out. Returns one 'admitted' row, or none when
-- the key is taken, the balance is short, the user's queue or delta limit is full, or the
-- reservation is gone (the caller asks admit_state why).
CREATE FUNCTION queue_admit_job(
    p_job_id uuid,
    p_user_id text,
    p_run_id uuid,
    p_idempotency_key text,
    p_request_digest bytea,
    p_delta_of_job_id uuid,
    p_price integer,
    p_actor text,
    p_reason text,
    p_default_max_active integer,
    p_max_queued integer,
    p_max_running_deltas integer,
    p_release_window_seconds double precision,
    p_release_lease_seconds double precision,
    p_reconcile_after_seconds double precision
)
RETURNS TABLE (row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
LANGUAGE plpgsql AS $$
DECLARE
    v_is_delta constant boolean := p_delta_of_job_id IS NOT NULL;
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
            release_deadline, start_time, next_reconcile_at)
        SELECT p_job_id, p_user_id, p_run_id, p_idempotency_key, p_request_digest,
               CASE WHEN v_is_delta THEN 'running' WHEN pl.slot IS NOT NULL THEN 'pending' ELSE 'queued' END,
               nextval('analysis_jobs_queue_seq'),
               pl.slot,
               p_delta_of_job_id,
               p_price,
               pl.now,
               CASE WHEN v_is_delta OR pl.slot IS NOT NULL THEN pl.now END,
               CASE WHEN pl.slot IS NOT NULL THEN pl.now + make_interval(secs => p_release_lease_seconds) END,
               CASE WHEN pl.slot IS NOT NULL THEN 1 ELSE 0 END,
               CASE WHEN pl.slot IS NOT NULL THEN pl.now + make_interval(secs => p_release_window_seconds) END,
               CASE WHEN v_is_delta THEN pl.now END,
               CASE WHEN v_is_delta THEN pl.now + make_interval(secs => p_reconcile_after_seconds) END
          FROM placement pl, reservation r
         WHERE (p_price = 0 OR EXISTS (SELECT 1 FROM credit_accounts c
                                        WHERE c.user_id = p_user_id AND c.balance >= p_price))
           AND (v_is_delta OR pl.queued < p_max_queued)
           AND (NOT v_is_delta OR (SELECT count(*) FROM analysis_jobs d
                                    WHERE d.user_id = p_user_id AND d.status = 'running'
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

-- The views of jobs a section just promoted, as 'promoted' rows in the given order. Each read is a
-- statement of its own (it sees the promotions) and goes by primary key: a join of the array with
-- the view, planned generically, cost twenty times more.
CREATE FUNCTION queue_promoted_views(p_job_ids uuid[])
RETURNS TABLE (row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
LANGUAGE plpgsql AS $$
DECLARE
    v_job_id uuid;
BEGIN
    FOREACH v_job_id IN ARRAY p_job_ids LOOP
        RETURN QUERY SELECT 'promoted'::text, 0, false, v FROM analysis_job_views v WHERE v.job_id = v_job_id;
    END LOOP;
END
$$;

-- Ends a job as `queue_end_job` does (fenced by its expected statuses and attempt; refund when
-- asked; promotion into the freed slots when its run is settled). Returns nothing when fenced;
-- else an 'ended' row (the refunded amount, whether the run is unsettled, the job's view after
-- the change) followed by a 'promoted' row per promoted job.
CREATE FUNCTION queue_end_job_viewed(
    p_job_id uuid,
    p_status text,
    p_from_statuses text[],
    p_last_error text,
    p_expected_attempts integer,
    p_run_unsettled boolean,
    p_refund boolean,
    p_actor text,
    p_reason text,
    p_default_max_active integer,
    p_release_window_seconds double precision,
    p_lease_seconds double precision
)
RETURNS TABLE (row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
LANGUAGE plpgsql AS $$
DECLARE
    v_ending record;
    v_ended_refund integer;
    v_ended_unsettled boolean;
    v_promoted uuid[] := '{}';
BEGIN
    FOR v_ending IN
        SELECT * FROM queue_end_job(p_job_id, p_status, p_from_statuses, p_last_error, p_expected_attempts,
                                    p_run_unsettled, p_refund, p_actor, p_reason, p_default_max_active,
                                    p_release_window_seconds, p_lease_seconds)
    LOOP
        IF v_ending.row_kind = 'ended' THEN
            v_ended_refund := v_ending.out_refunded;
            v_ended_unsettled := v_ending.out_run_unsettled;
        ELSE
            v_promoted := v_promoted || v_ending.out_job_id;
        END IF;
    END LOOP;
    IF v_ended_refund IS NULL THEN
        RETURN;
    END IF;
    -- Each RETURN QUERY is a statement of its own: it sees the ending and the promotions.
    RETURN QUERY SELECT 'ended'::text, v_ended_refund, v_ended_unsettled, v
                   FROM analysis_job_views v WHERE v.job_id = p_job_id;
    RETURN QUERY SELECT * FROM queue_promoted_views(v_promoted);
END
$$;

-- Fills every free slot of the user from the queue, oldest first, each promoted job's first
-- release claimed for the calling replica (`queue_promote_queued_jobs`). A 'promoted' row per
-- promoted job, in order.
CREATE FUNCTION queue_promote_viewed(
    p_user_id text, p_default_max_active integer, p_release_window_seconds double precision, p_lease_seconds double precision)
RETURNS TABLE (row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
LANGUAGE plpgsql AS $$
DECLARE
    v_promoted uuid[];
BEGIN
    SELECT coalesce(array_agg(p.promoted_job_id), '{}') INTO v_promoted
      FROM queue_promote_queued_jobs(p_user_id, p_default_max_active, p_release_window_seconds, p_lease_seconds) AS p;
    RETURN QUERY SELECT * FROM queue_promoted_views(v_promoted);
END
$$;

-- The core confirmed an ended job's run settled: the job lets go of its slot, and the user's next
-- jobs are promoted into every free slot. The user is the one whose lock the caller holds. A 'settled' row when the run was unsettled until now,
-- then a 'promoted' row per promoted job.
CREATE FUNCTION queue_settle_job_run(
    p_job_id uuid, p_user_id text, p_default_max_active integer, p_release_window_seconds double precision,
    p_lease_seconds double precision)
RETURNS TABLE (row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE analysis_jobs a
       SET run_settle_due_at = NULL
     WHERE a.job_id = p_job_id AND a.user_id = p_user_id AND a.run_settle_due_at IS NOT NULL;
    IF FOUND THEN
        RETURN QUERY SELECT 'settled'::text, 0, false, v FROM analysis_job_views v WHERE v.job_id = p_job_id;
    END IF;
    RETURN QUERY SELECT * FROM queue_promote_viewed(p_user_id, p_default_max_active, p_release_window_seconds, p_lease_seconds);
END
$$;

-- A job the user canceled is never charged: refunds it if it ended FAILED (a completion that won
-- the race with the cancel). A 'refunded' row with the amount (0: no charge, or already refunded);
-- none when the job did not fail.
CREATE FUNCTION queue_refund_failed_job(p_job_id uuid, p_actor text, p_reason text)
RETURNS TABLE (row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
LANGUAGE plpgsql AS $$
DECLARE
    v_amount integer;
BEGIN
    PERFORM 1 FROM analysis_jobs a WHERE a.job_id = p_job_id AND a.status = 'failed';
    IF NOT FOUND THEN
        RETURN;
    END IF;
    v_amount := queue_refund_job_charge(p_job_id, p_actor, p_reason);
    RETURN QUERY SELECT 'refunded'::text, v_amount, false, v FROM analysis_job_views v WHERE v.job_id = p_job_id;
END
$$;
