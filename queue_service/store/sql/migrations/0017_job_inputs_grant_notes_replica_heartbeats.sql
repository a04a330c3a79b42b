-- What a job judges: its document and sources, kept with the job (docs/console.md, "What a job
-- is"; OperatorService.RetryJob admits them again), a grant's note in the ledger, and a
-- heartbeat row per replica (at the end).
--
-- `sources` holds every source as admitted (a JSON array of {"doi", "citation"}, at most 1000 by
-- the admit's validation); only RetryJob reads it. What every read of a job shows is small and
-- bounded: the document, the number of sources, and `sources_preview`, the first 10 with each
-- citation cut to 512 characters, written once at admit. The view appends those columns (a
-- column appended to a view keeps every function that returns its rows valid), so no list or
-- stream ever reads the full array.
--
-- Additive: the columns are nullable without defaults (no table rewrite; the checks cost one
-- sequential read of each table under the ALTER's lock, a NOT VALID check would leave the
-- fresh schema and the migrated one different). Old replicas call the 15-argument
-- `queue_admit_job`, which now admits through the new one with no document.

ALTER TABLE analysis_jobs
    ADD COLUMN document_uri    text,
    ADD COLUMN document_title  text,
    ADD COLUMN sources         jsonb,
    ADD COLUMN source_count    integer,
    ADD COLUMN sources_preview jsonb;
ALTER TABLE analysis_jobs
    ADD CONSTRAINT analysis_jobs_document_bounded
        CHECK (char_length(document_uri) <= 2048 AND char_length(document_title) <= 512),
    ADD CONSTRAINT analysis_jobs_sources_bounded
        CHECK (source_count BETWEEN 0 AND 1000 AND jsonb_array_length(sources_preview) <= 10);

-- Why an operator granted credits, in their words (GrantCreditsRequest.note).
ALTER TABLE credit_ledger ADD COLUMN note text;
ALTER TABLE credit_ledger ADD CONSTRAINT credit_ledger_note_bounded CHECK (char_length(note) <= 512);

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
       j.capacity_wait_since,
       j.document_uri, j.document_title, j.source_count, j.sources_preview
  FROM analysis_jobs j;

-- The admit of migration 0009 with what the job judges (the same statement otherwise).
CREATE FUNCTION queue_admit_job(p_job_id uuid, p_user_id text, p_run_id uuid, p_idempotency_key text, p_request_digest bytea, p_delta_of_job_id uuid, p_price integer, p_actor text, p_reason text, p_default_max_active integer, p_max_queued integer, p_max_running_deltas integer, p_release_window_seconds double precision, p_release_lease_seconds double precision, p_reconcile_after_seconds double precision, p_document_uri text, p_document_title text, p_sources jsonb)
 RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
 LANGUAGE plpgsql
AS $function$
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
            release_deadline, start_time, next_reconcile_at,
            document_uri, document_title, sources, source_count, sources_preview)
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
               CASE WHEN v_is_delta THEN pl.now + make_interval(secs => p_reconcile_after_seconds) END,
               p_document_uri, p_document_title, p_sources, jsonb_array_length(p_sources),
               (SELECT jsonb_agg(jsonb_build_object('doi', s.e->>'doi', 'citation', left(s.e->>'citation', 512)) ORDER BY s.n)
                  FROM jsonb_array_elements(p_sources) WITH ORDINALITY AS s(e, n)
                 WHERE s.n <= 10)
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
$function$;

-- The admit as replicas of the previous version call it: no document stored.
CREATE OR REPLACE FUNCTION queue_admit_job(p_job_id uuid, p_user_id text, p_run_id uuid, p_idempotency_key text, p_request_digest bytea, p_delta_of_job_id uuid, p_price integer, p_actor text, p_reason text, p_default_max_active integer, p_max_queued integer, p_max_running_deltas integer, p_release_window_seconds double precision, p_release_lease_seconds double precision, p_reconcile_after_seconds double precision)
RETURNS TABLE(row_kind text, refunded_amount integer, run_unsettled boolean, job_view analysis_job_views)
LANGUAGE sql AS $$
    SELECT * FROM queue_admit_job(p_job_id, p_user_id, p_run_id, p_idempotency_key, p_request_digest, p_delta_of_job_id,
                                  p_price, p_actor, p_reason, p_default_max_active, p_max_queued, p_max_running_deltas,
                                  p_release_window_seconds, p_release_lease_seconds, p_reconcile_after_seconds,
                                  NULL::text, NULL::text, NULL::jsonb)
$$;

-- What each replica reports about itself (OperatorService.ListReplicas): a row per replica,
-- written every few seconds by its heartbeat and deleted when it stops cleanly; a row whose
-- heartbeat stopped is a replica that died (kept an hour, then the next heartbeat of any replica
-- deletes it). The core's health as this replica saw it since it started: calls the core
-- answered, refused, and whose outcome is unknown (no answer; maybe applied).
CREATE TABLE queue_replicas (
    replica_id           text PRIMARY KEY,
    host                 text NOT NULL,
    start_time           timestamptz NOT NULL,
    heartbeat_time       timestamptz NOT NULL DEFAULT clock_timestamp(),
    draining             boolean NOT NULL DEFAULT false,
    calls_in_flight      integer NOT NULL DEFAULT 0,
    watch_streams        integer NOT NULL DEFAULT 0,
    overview_streams     integer NOT NULL DEFAULT 0,
    core_answered        bigint NOT NULL DEFAULT 0,
    core_refused         bigint NOT NULL DEFAULT 0,
    core_unknown         bigint NOT NULL DEFAULT 0,
    core_last_unknown_at timestamptz
);
CREATE INDEX queue_replicas_by_heartbeat ON queue_replicas (heartbeat_time);
