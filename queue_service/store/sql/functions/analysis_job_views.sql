-- analysis_job_views: the view.
--
-- Why, migration by migration (its text below is the last one's):
-- * 0001 (queue and credits): The API's view of a job: its row plus what a waiting user wants to
--   know (design 4b).
-- * 0006 (job view reads refunds per row): `refunded` as a correlated scalar subquery (at most one
--   refund per job, by the ledger's unique (job_id, kind)) instead of EXISTS: for a read the
--   planner expects to be large (the operator's search across users, newest first), it turned the
--   EXISTS into a hashed subplan that read every refund in the ledger before returning the first
--   row: 1.4 s at p50 on a 1M-job history. A scalar subquery is always run per returned row,
--   through the ledger's unique index.
-- * 0014 (fleet capacity): The job view gains whether the job waits for capacity, and since when
--   (appended columns).
-- * 0017 (job inputs grant notes replica heartbeats): What a job judges: its document and sources,
--   kept with the job (docs/console.md, "What a job is"; OperatorService.RetryJob admits them
--   again), a grant's note in the ledger, and a heartbeat row per replica (at the end).
-- * 0027 (retry lineage and cancel actor): The job it retries, the jobs that retried it (oldest
--   first, through the index of retries), and who canceled it (appended columns).

CREATE OR REPLACE VIEW public.analysis_job_views AS
 SELECT job_id,
    user_id,
    run_id,
    status,
    delta_of_job_id,
    release_attempts,
    last_error,
    create_time,
    promote_time,
    start_time,
    end_time,
    price,
    queue_seq,
        CASE
            WHEN status = 'queued'::text THEN ( SELECT count(*) AS count
               FROM analysis_jobs q
              WHERE q.user_id = j.user_id AND q.status = 'queued'::text AND q.queue_seq <= j.queue_seq)
            ELSE 0::bigint
        END AS queue_position,
        CASE
            WHEN status = 'queued'::text THEN COALESCE(( SELECT q.job_id
               FROM analysis_jobs q
              WHERE q.user_id = j.user_id AND q.status = 'queued'::text AND q.queue_seq < j.queue_seq
              ORDER BY q.queue_seq DESC
             LIMIT 1), ( SELECT a.job_id
               FROM analysis_jobs a
              WHERE a.user_id = j.user_id AND (a.status = ANY (ARRAY['pending'::text, 'running'::text])) AND a.delta_of_job_id IS NULL
              ORDER BY a.promote_time, a.queue_seq
             LIMIT 1))
            ELSE NULL::uuid
        END AS waiting_for_job_id,
        CASE
            WHEN status = 'queued'::text THEN ( SELECT min(COALESCE(a.start_time, a.promote_time)) AS min
               FROM analysis_jobs a
              WHERE a.user_id = j.user_id AND (a.status = ANY (ARRAY['pending'::text, 'running'::text])) AND a.delta_of_job_id IS NULL)
            ELSE NULL::timestamp with time zone
        END AS active_since,
    ( SELECT l.max_active
           FROM user_queue_limits l
          WHERE l.user_id = j.user_id) AS max_active_override,
    COALESCE(( SELECT true
           FROM credit_ledger r
          WHERE r.job_id = j.job_id AND r.kind = 'refund'::text), false) AS refunded,
    status = 'pending'::text AND capacity_wait_since IS NOT NULL AND capacity_token IS NULL AS waiting_for_capacity,
    capacity_wait_since,
    document_uri,
    document_title,
    source_count,
    sources_preview,
    retry_of_job_id,
    ARRAY( SELECT r.job_id
           FROM analysis_jobs r
          WHERE r.retry_of_job_id = j.job_id
          ORDER BY r.create_time, r.job_id) AS retried_as_job_ids,
    canceled_by
   FROM analysis_jobs j;
