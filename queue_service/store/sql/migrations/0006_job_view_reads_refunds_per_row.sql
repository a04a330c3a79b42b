-- `refunded` as a correlated scalar subquery (at most one refund per job, by the ledger's unique
-- (job_id, kind)) instead of EXISTS: for a read the planner expects to be large (the operator's
-- search across users, newest first), it turned the EXISTS into a hashed subplan that read every
-- refund in the ledger before returning the first row: 1.4 s at p50 on a 1M-job history. A scalar
-- subquery is always run per returned row, through the ledger's unique index.
CREATE OR REPLACE VIEW analysis_job_views AS
SELECT j.job_id, j.user_id, j.run_id, j.status, j.delta_of_job_id, j.release_attempts, j.last_error,
       j.create_time, j.promote_time, j.start_time, j.end_time, j.price, j.queue_seq,
       CASE WHEN j.status = 'queued' THEN (
           SELECT count(*) FROM analysis_jobs q
            WHERE q.user_id = j.user_id AND q.status = 'queued' AND q.queue_seq <= j.queue_seq)
       ELSE 0 END AS queue_position,
       CASE WHEN j.status = 'queued' THEN COALESCE(
           (SELECT q.job_id FROM analysis_jobs q
             WHERE q.user_id = j.user_id AND q.status = 'queued' AND q.queue_seq < j.queue_seq
             ORDER BY q.queue_seq DESC LIMIT 1),
           (SELECT a.job_id FROM analysis_jobs a
             WHERE a.user_id = j.user_id AND a.status IN ('pending', 'running') AND a.delta_of_job_id IS NULL
             ORDER BY a.promote_time, a.queue_seq LIMIT 1))
       END AS waiting_for_job_id,
       CASE WHEN j.status = 'queued' THEN (
           SELECT min(COALESCE(a.start_time, a.promote_time)) FROM analysis_jobs a
            WHERE a.user_id = j.user_id AND a.status IN ('pending', 'running') AND a.delta_of_job_id IS NULL)
       END AS active_since,
       (SELECT l.max_active FROM user_queue_limits l WHERE l.user_id = j.user_id) AS max_active_override,
       COALESCE((SELECT true FROM credit_ledger r WHERE r.job_id = j.job_id AND r.kind = 'refund'), false) AS refunded
  FROM analysis_jobs j;
