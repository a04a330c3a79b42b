-- One round trip per locked section (docs/scaling.md): what a completion, a cancel, a give-up or a
-- settlement does under the user's queue lock (end the job, refund it, fill the freed slots) runs
-- in the database as one call, so the store sends BEGIN, the lock, the call and COMMIT together.
-- The user's queue lock stays with `store/locks.py`, which takes it in the same batch before the
-- call: these functions take no lock of their own, and are only ever called under it.
-- Additive: replicas of earlier versions keep using their own statements on the same tables.

-- Gives a job's charge back, at most once (the ledger's unique (job, kind) makes a second refund a
-- no-op), recording who and why. Returns the refunded amount (0: no charge, or already refunded).
CREATE FUNCTION queue_refund_job_charge(p_job_id uuid, p_actor text, p_reason text) RETURNS integer
LANGUAGE sql AS $$
    WITH refund AS (
        INSERT INTO credit_ledger (user_id, kind, amount, job_id, actor, reason)
        SELECT user_id, 'refund', -amount, job_id, p_actor, p_reason
          FROM credit_ledger
         WHERE job_id = p_job_id AND kind = 'charge'
        ON CONFLICT (job_id, kind) DO NOTHING
        RETURNING user_id, amount
    ),
    credited AS (
        UPDATE credit_accounts c
           SET balance = c.balance + refund.amount, updated_at = clock_timestamp()
          FROM refund
         WHERE c.user_id = refund.user_id
        RETURNING refund.amount
    )
    SELECT COALESCE((SELECT amount FROM credited), 0)
$$;

-- Fills every free slot of the user from the queue, oldest first. Each promoted job's first
-- release is claimed for the calling replica at once (attempt 1, leased for `p_lease_seconds`),
-- which releases it right after COMMIT; if it cannot, the lease runs out and any replica's
-- dispatcher claims the release. Returns the promoted jobs in order.
CREATE FUNCTION queue_promote_queued_jobs(
    p_user_id text, p_default_max_active integer, p_release_window_seconds double precision, p_lease_seconds double precision)
RETURNS TABLE (promoted_job_id uuid, promoted_run_id uuid)
LANGUAGE plpgsql AS $$
DECLARE
    v_slot integer;
BEGIN
    LOOP
        v_slot := analysis_jobs_free_slot(p_user_id, p_default_max_active);
        EXIT WHEN v_slot IS NULL;
        UPDATE analysis_jobs j
           SET status = 'pending',
               slot = v_slot,
               promote_time = clock_timestamp(),
               next_release_at = clock_timestamp() + make_interval(secs => p_lease_seconds),
               release_deadline = clock_timestamp() + make_interval(secs => p_release_window_seconds),
               release_attempts = 1
         WHERE j.job_id = (SELECT q.job_id FROM analysis_jobs q
                            WHERE q.user_id = p_user_id AND q.status = 'queued'
                            ORDER BY q.queue_seq
                            LIMIT 1)
        RETURNING j.job_id, j.run_id INTO promoted_job_id, promoted_run_id;
        EXIT WHEN NOT FOUND;
        RETURN NEXT;
    END LOOP;
END
$$;

-- Ends a job if it is still in one of the expected statuses (and, when given, still at the
-- release attempt the caller saw), refunds it when asked, and, when its run is settled, promotes
-- the user's next jobs into the freed slots. With `p_run_unsettled` the job keeps its slot (if it
-- has one) until the core confirms its run settled, and a CancelRun is due at once.
-- Returns nothing when the job was not in an expected status (fenced); else one row of kind
-- 'ended' (the job, and the refunded amount) followed by one row of kind 'promoted' per promoted job.
CREATE FUNCTION queue_end_job(
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
RETURNS TABLE (row_kind text, out_job_id uuid, out_user_id text, out_run_id uuid, out_status text,
               out_delta_of_job_id uuid, out_run_unsettled boolean, out_refunded integer)
LANGUAGE plpgsql AS $$
DECLARE
    ended analysis_jobs%ROWTYPE;
BEGIN
    UPDATE analysis_jobs a
       SET status = p_status,
           end_time = clock_timestamp(),
           last_error = CASE WHEN p_last_error <> '' THEN p_last_error ELSE a.last_error END,
           next_release_at = NULL,
           next_reconcile_at = NULL,
           run_settle_due_at = CASE WHEN p_run_unsettled THEN clock_timestamp() END
     WHERE a.job_id = p_job_id
       AND a.status = ANY(p_from_statuses)
       AND (p_expected_attempts IS NULL OR a.release_attempts = p_expected_attempts)
    RETURNING a.* INTO ended;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT 'ended', ended.job_id, ended.user_id, ended.run_id, ended.status, ended.delta_of_job_id,
                        ended.run_settle_due_at IS NOT NULL,
                        CASE WHEN p_refund THEN queue_refund_job_charge(ended.job_id, p_actor, p_reason) ELSE 0 END;
    IF NOT p_run_unsettled THEN
        RETURN QUERY SELECT 'promoted', p.promoted_job_id, ended.user_id, p.promoted_run_id, 'pending'::text,
                            NULL::uuid, false, 0
                       FROM queue_promote_queued_jobs(ended.user_id, p_default_max_active, p_release_window_seconds, p_lease_seconds) AS p;
    END IF;
END
$$;

-- Change notices say whether a PENDING job's release is already claimed (by the replica that
-- promoted or admitted it, which releases it itself): other replicas' dispatchers then need not
-- wake. Notices of replicas that do not claim (earlier versions) carry no such field and wake
-- every dispatcher, as before.
CREATE OR REPLACE FUNCTION analysis_jobs_announce_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(
        'analysis_job_changes',
        json_build_object(
            'user_id', NEW.user_id,
            'job_id', NEW.job_id,
            'status', NEW.status,
            'old_status', CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END,
            'release_claimed', NEW.status = 'pending' AND NEW.release_attempts > 0
        )::text);
    RETURN NULL;
END;
$$;
