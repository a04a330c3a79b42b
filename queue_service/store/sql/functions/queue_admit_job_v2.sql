-- queue_admit_job_v2: the function, the admit the service calls (the named query admit_job).
-- requires: analysis_job_views, queue_seat_on_entry
--
-- The whole placement is here: a job it admits PENDING (a first-pass job given a slot, or a held
-- delta) takes its place at the capacity from queue_seat_on_entry in the INSERT (it waits for a
-- grant while the capacity is limited or its releases are paused: no release due, no attempt
-- counted), and the lineage is the caller's parameter. No trigger finishes the row.
--
-- Why, migration by migration (its text below is the last one's; 0009-0023
-- wrote it as queue_admit_job; 0039: the seat from queue_seat_on_entry, where the trigger
-- analysis_jobs_wait_for_capacity set it):
-- * 0009 (locked sections in one statement): Admits a job: inserts it, debits its price and writes
--   the charge, deciding its status in the INSERT ('pending' with a slot when a slot is free and
--   nobody is queued ahead, else 'queued'; a delta starts 'running' and never takes a slot). A
--   'pending' job's first release is claimed for the calling replica at once (attempt 1, leased).
--   The run's reservation is consumed; one the sweeper has started to cancel fences the insert out.
--   Returns one 'admitted' row, or none when the key is taken, the balance is short, the user's
--   queue or delta limit is full, or the reservation is gone (the caller asks admit_state why).
-- * 0017 (job inputs grant notes replica heartbeats): The admit of migration 0009 with what the job
--   judges (the same statement otherwise). The admit as replicas of the previous version call it:
--   no document stored.
-- * 0023 (deltas take turns under the capacity): The locked admit, deciding a delta's placement by
--   whether its run was created held (`p_delta_held`: the fleet's capacity was limited when the
--   admit looked). A held delta is PENDING with its first release claimed (the capacity trigger
--   makes it wait for a grant while the capacity is limited), one created judging is RUNNING.
--   Waiting and judging deltas count toward the user's delta limit. The previous version's admit:
--   its deltas are created judging.
-- * 0038 (retry lineage from its writer): 0023's admit under a new name, with the job it admits
--   again as a parameter: `p_retry_of_job_id` (OperatorService.RetryJob's ended job,
--   api/servicers/retry.py; NULL for every other admit), written by the INSERT itself. Before, the
--   trigger analysis_jobs_retry_lineage read it from the idempotency key behind its writer. A new
--   name, not a fourth overload (README.md, "A change of meaning gets a new name"): the old
--   signatures mean "the trigger finishes the lineage", and they go whole, with the trigger, once no
--   replica of the previous version calls them.

CREATE OR REPLACE FUNCTION public.queue_admit_job_v2(p_job_id uuid, p_user_id text, p_run_id uuid, p_idempotency_key text, p_request_digest bytea, p_delta_of_job_id uuid, p_price integer, p_actor text, p_reason text, p_default_max_active integer, p_max_queued integer, p_max_running_deltas integer, p_release_window_seconds double precision, p_release_lease_seconds double precision, p_reconcile_after_seconds double precision, p_document_uri text, p_document_title text, p_sources jsonb, p_delta_held boolean, p_retry_of_job_id uuid)
 RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
 LANGUAGE plpgsql
AS $function$
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
            capacity_wait_since, capacity_turn_key, release_deadline, start_time, next_reconcile_at,
            document_uri, document_title, sources, source_count, sources_preview, retry_of_job_id)
        SELECT p_job_id, p_user_id, p_run_id, p_idempotency_key, p_request_digest,
               CASE WHEN v_delta_judging THEN 'running' WHEN v_delta_held OR pl.slot IS NOT NULL THEN 'pending' ELSE 'queued' END,
               nextval('analysis_jobs_queue_seq'),
               pl.slot,
               p_delta_of_job_id,
               p_price,
               pl.now,
               CASE WHEN v_is_delta OR pl.slot IS NOT NULL THEN pl.now END,
               seat.next_release_at,
               seat.release_attempts,
               seat.capacity_wait_since,
               seat.capacity_turn_key,
               CASE WHEN v_delta_held OR pl.slot IS NOT NULL THEN pl.now + make_interval(secs => p_release_window_seconds) END,
               CASE WHEN v_delta_judging THEN pl.now END,
               CASE WHEN v_delta_judging THEN pl.now + make_interval(secs => p_reconcile_after_seconds) END,
               p_document_uri, p_document_title, p_sources, jsonb_array_length(p_sources),
               (SELECT jsonb_agg(jsonb_build_object('doi', s.e->>'doi', 'citation', left(s.e->>'citation', 512)) ORDER BY s.n)
                  FROM jsonb_array_elements(p_sources) WITH ORDINALITY AS s(e, n)
                 WHERE s.n <= 10),
               p_retry_of_job_id
          FROM placement pl, reservation r,
               LATERAL queue_seat_on_entry(
                   p_user_id, v_delta_held OR pl.slot IS NOT NULL, pl.now,
                   CASE WHEN v_delta_held OR pl.slot IS NOT NULL THEN pl.now + make_interval(secs => p_release_lease_seconds) END,
                   CASE WHEN v_delta_held OR pl.slot IS NOT NULL THEN 1 ELSE 0 END) AS seat
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
$function$;
