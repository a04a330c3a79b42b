-- A user's jobs as the API reads them: by id, a page, the active ones, a WatchJobs resync, the
-- queued ones, and the figures estimates and gauges read.

-- name: job_views_by_ids
-- The API view of the given jobs.
SELECT * FROM analysis_job_views WHERE job_id = ANY(%(job_ids)s::uuid[]);

-- name: list_job_views
-- One page of a user's jobs, newest first (keyset on queue_seq), optionally by status. The page
-- starts after `after_job_id` (the last job of the previous page, one of this user's own), or
-- below `before_seq` (page tokens of earlier versions).
SELECT * FROM analysis_job_views
 WHERE user_id = %(user_id)s
   AND (%(before_seq)s::bigint IS NULL OR queue_seq < %(before_seq)s::bigint)
   AND (%(after_job_id)s::uuid IS NULL
        OR queue_seq < (SELECT a.queue_seq FROM analysis_jobs a
                         WHERE a.job_id = %(after_job_id)s::uuid AND a.user_id = %(user_id)s))
   AND (cardinality(%(statuses)s::text[]) = 0 OR status = ANY(%(statuses)s::text[]))
 ORDER BY queue_seq DESC
 LIMIT %(limit)s;

-- name: active_job_views_of_user
-- One page of a user's queued, pending and running jobs in queue order: those after queue_seq
-- `after_seq` (the WatchJobs snapshot, read a page at a time).
SELECT * FROM analysis_job_views
 WHERE user_id = %(user_id)s AND status IN ('queued', 'pending', 'running') AND queue_seq > %(after_seq)s
 ORDER BY queue_seq
 LIMIT %(limit)s;

-- name: watch_resync_views
-- One page (after queue_seq `after_seq`, in queue order) of what a WatchJobs stream missed during
-- a gap: the user's active jobs, the jobs it last reported as active (by queue_seq; they may have
-- ended meanwhile), and every job admitted after the newest it knew.
SELECT v.* FROM analysis_job_views v
 WHERE v.user_id = %(user_id)s
   AND v.queue_seq > %(after_seq)s
   AND v.job_id IN (SELECT a.job_id FROM analysis_jobs a
                     WHERE a.user_id = %(user_id)s AND a.queue_seq > %(after_seq)s
                       AND a.status IN ('queued', 'pending', 'running')
                    UNION ALL
                    SELECT r.job_id FROM analysis_jobs r
                     WHERE r.user_id = %(user_id)s AND r.queue_seq = ANY(%(seqs)s::bigint[])
                       AND r.queue_seq > %(after_seq)s
                    UNION ALL
                    SELECT n.job_id FROM analysis_jobs n
                     WHERE n.user_id = %(user_id)s AND n.queue_seq > GREATEST(%(newest_known_seq)s, %(after_seq)s))
 ORDER BY v.queue_seq
 LIMIT %(limit)s;

-- name: newest_seq_of_user
-- The queue_seq of the user's newest job (0 without jobs): where a WatchJobs stream's knowledge ends.
SELECT COALESCE(max(queue_seq), 0) AS seq FROM analysis_jobs WHERE user_id = %(user_id)s;

-- name: queued_job_views_of_user
-- A user's queued jobs in queue order (their positions shift when one leaves the queue).
SELECT * FROM analysis_job_views
 WHERE user_id = %(user_id)s AND status = 'queued'
 ORDER BY queue_seq;

-- name: recent_judging_seconds
-- Mean judging time of the latest first-pass jobs, for estimated start times.
SELECT avg(extract(epoch FROM end_time - start_time))::float8 AS seconds
  FROM (SELECT end_time, start_time FROM analysis_jobs
         WHERE status = 'succeeded' AND delta_of_job_id IS NULL AND start_time IS NOT NULL
         ORDER BY end_time DESC
         LIMIT 50) AS recent;

-- name: queue_depth
-- Jobs waiting, users waiting and jobs active, for the gauges (partial indexes only).
SELECT (SELECT count(*) FROM analysis_jobs WHERE status = 'queued') AS queued,
       (SELECT count(DISTINCT user_id) FROM analysis_jobs WHERE status = 'queued') AS users_waiting,
       (SELECT count(*) FROM analysis_jobs WHERE status = 'pending') AS pending,
       (SELECT count(*) FROM analysis_jobs WHERE status = 'running') AS running;
