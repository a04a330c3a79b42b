-- The operator's reads and records: the overview and its history, users with work, a job's
-- inputs, the replicas' heartbeats, the core's health they report, actions and the audit timeline.

-- name: job_inputs
-- What a job was admitted with, in full (OperatorService.RetryJob); its primary key finds it.
-- `source_count` set with `sources` NULL: the sources were pruned past their retention. Its
-- newest retry, if any (the index of retries), guards a plain retry from admitting another.
SELECT j.job_id, j.user_id, j.status, j.delta_of_job_id, j.document_uri, j.document_title, j.sources, j.source_count,
       (SELECT r.job_id FROM analysis_jobs r
         WHERE r.retry_of_job_id = j.job_id
         ORDER BY r.create_time DESC, r.job_id DESC LIMIT 1) AS newest_retry_job_id
  FROM analysis_jobs j
 WHERE j.job_id = %(job_id)s;

-- name: operator_overview
-- The operator's overview: active jobs from the partial indexes over the rows in flight, ended
-- jobs and admits within the window from the time indexes (`analysis_jobs_*newest_admitted`,
-- `analysis_jobs_recently_ended`). `now()`, not
-- clock_timestamp(): a volatile bound cannot be an index condition (the statement runs alone in
-- its transaction, so both are the same instant).
SELECT (SELECT count(*) FROM analysis_jobs WHERE status = 'queued') AS queued,
       (SELECT count(*) FROM analysis_jobs WHERE status = 'pending') AS pending,
       (SELECT count(*) FROM analysis_jobs WHERE status = 'running') AS running,
       (SELECT count(DISTINCT user_id) FROM analysis_jobs WHERE status = 'queued') AS users_waiting,
       (SELECT min(create_time) FROM analysis_jobs WHERE status = 'queued') AS oldest_queued_create_time,
       (SELECT count(*) FROM analysis_jobs
         WHERE status = 'pending' AND release_attempts > 0 AND last_error <> '') AS releases_retrying,
       -- Being reconciled with the core: RUNNING jobs whose completion is overdue or that were
       -- made due for a GetRun (after a failover), and ended jobs whose run the core has not
       -- confirmed settled yet (a run the core lost, a release given up): they keep their seats.
       ((SELECT count(*) FROM analysis_jobs
          WHERE status = 'running'
            AND (start_time < now() - make_interval(secs => %(reconcile_after_seconds)s) OR next_reconcile_at <= now()))
        + (SELECT count(*) FROM analysis_jobs WHERE run_settle_due_at IS NOT NULL)) AS runs_reconciling,
       ended.succeeded_in_window, ended.failed_in_window, ended.canceled_in_window,
       clock_timestamp() AS read_time
  FROM (SELECT count(*) FILTER (WHERE status = 'succeeded') AS succeeded_in_window,
               count(*) FILTER (WHERE status = 'failed') AS failed_in_window,
               count(*) FILTER (WHERE status = 'canceled') AS canceled_in_window
          FROM (SELECT status FROM analysis_jobs
                 WHERE end_time IS NOT NULL
                   AND end_time >= now() - make_interval(mins => %(window_minutes)s)
                 -- The order and the cap keep a prepared (generic) plan on the end_time index
                 -- whatever the window; a window with more ended jobs counts its newest 100000.
                 ORDER BY end_time DESC
                 LIMIT 100000) AS recent) AS ended;

-- name: users_with_work
-- The users with a QUEUED, PENDING or RUNNING job, the one waiting longest first. Each arm reads
-- one status through its partial index (the rows in flight), as the overview's counts do.
SELECT user_id,
       count(*) FILTER (WHERE status = 'queued') AS queued,
       count(*) FILTER (WHERE status = 'pending') AS pending,
       count(*) FILTER (WHERE status = 'running') AS running,
       min(create_time) FILTER (WHERE status = 'queued') AS oldest_queued_create_time,
       min(create_time) AS oldest_create_time,
       count(*) OVER () AS users_total
  FROM (SELECT user_id, status, create_time FROM analysis_jobs WHERE status = 'queued'
        UNION ALL
        SELECT user_id, status, create_time FROM analysis_jobs WHERE status = 'pending'
        UNION ALL
        SELECT user_id, status, create_time FROM analysis_jobs WHERE status = 'running') AS live
 GROUP BY user_id
 ORDER BY min(create_time) FILTER (WHERE status = 'queued') NULLS LAST, min(create_time), user_id
 LIMIT %(limit)s;

-- name: queue_history
-- A point per minute over the window: queued and active at the minute's end, admitted and ended
-- during it. The rows that can count are the ones in flight (partial indexes) and the window's
-- ended ones (the end_time index, capped as the overview caps them): every job admitted in the
-- window is one or the other. One pass: each job gives its events (admitted, promoted, ended) in
-- the window, counted per minute; the depth at a minute's end is the depth now minus what the
-- later minutes added (sums over the later minutes), so the cost grows with the window's jobs,
-- not with jobs times minutes. `now()`: index conditions (see operator_overview).
WITH bounds AS (
    SELECT date_trunc('minute', now()) - make_interval(mins => %(window_minutes)s - 1) AS first_minute
),
jobs AS (
    SELECT status, create_time, promote_time, end_time FROM analysis_jobs WHERE status = 'queued'
    UNION ALL
    SELECT status, create_time, promote_time, end_time FROM analysis_jobs WHERE status = 'pending'
    UNION ALL
    SELECT status, create_time, promote_time, end_time FROM analysis_jobs WHERE status = 'running'
    UNION ALL
    (SELECT status, create_time, promote_time, end_time FROM analysis_jobs
      WHERE end_time IS NOT NULL
        AND end_time >= date_trunc('minute', now()) - make_interval(mins => %(window_minutes)s - 1)
      ORDER BY end_time DESC
      LIMIT 100000)
),
depth_now AS (
    SELECT count(*) FILTER (WHERE status = 'queued') AS queued,
           count(*) FILTER (WHERE status IN ('pending', 'running')) AS active
      FROM jobs
),
events AS (
    -- (minute, admitted, promoted, left the queue, ended, ended while active)
    SELECT date_trunc('minute', j.create_time) AS minute, 1 AS admitted, 0 AS promoted, 0 AS left_queue, 0 AS ended, 0 AS ended_active
      FROM jobs j, bounds b WHERE j.create_time >= b.first_minute
    UNION ALL
    SELECT date_trunc('minute', j.promote_time), 0, 1, 1, 0, 0
      FROM jobs j, bounds b WHERE j.promote_time >= b.first_minute
    UNION ALL
    SELECT date_trunc('minute', j.end_time), 0, 0, (j.promote_time IS NULL)::int, 1, (j.promote_time IS NOT NULL)::int
      FROM jobs j, bounds b WHERE j.end_time >= b.first_minute
),
per_minute AS (
    SELECT m AS minute,
           count(e.minute) FILTER (WHERE e.admitted = 1) AS admitted,
           count(e.minute) FILTER (WHERE e.ended = 1) AS ended,
           COALESCE(sum(e.admitted - e.left_queue), 0) AS queued_change,
           COALESCE(sum(e.promoted - e.ended_active), 0) AS active_change
      FROM bounds b
     CROSS JOIN generate_series(b.first_minute, date_trunc('minute', now()), interval '1 minute') AS m
      LEFT JOIN events e ON e.minute = m
     GROUP BY m
)
SELECT p.minute, p.admitted, p.ended,
       d.queued - COALESCE(sum(p.queued_change) OVER later, 0) AS queued,
       d.active - COALESCE(sum(p.active_change) OVER later, 0) AS active
  FROM per_minute p, depth_now d
WINDOW later AS (ORDER BY p.minute DESC ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
 ORDER BY p.minute;

-- name: replica_heartbeat
-- This replica's report (`queue_replicas`), and the rows of replicas whose heartbeat stopped an
-- hour ago deleted (the index on heartbeat_time finds them).
WITH forgotten AS (
    DELETE FROM queue_replicas WHERE heartbeat_time < clock_timestamp() - interval '1 hour'
)
INSERT INTO queue_replicas AS r (replica_id, host, start_time, heartbeat_time, draining, calls_in_flight, watch_streams,
                                 overview_streams, core_answered, core_refused, core_unknown, core_last_unknown_at, core_health)
VALUES (%(replica_id)s, %(host)s, %(start_time)s, clock_timestamp(), %(draining)s, %(calls_in_flight)s, %(watch_streams)s,
        %(overview_streams)s, %(core_answered)s, %(core_refused)s, %(core_unknown)s, %(core_last_unknown_at)s,
        %(core_health)s)
ON CONFLICT (replica_id) DO UPDATE
   SET heartbeat_time = EXCLUDED.heartbeat_time, draining = EXCLUDED.draining,
       calls_in_flight = EXCLUDED.calls_in_flight, watch_streams = EXCLUDED.watch_streams,
       overview_streams = EXCLUDED.overview_streams, core_answered = EXCLUDED.core_answered,
       core_refused = EXCLUDED.core_refused, core_unknown = EXCLUDED.core_unknown,
       core_last_unknown_at = EXCLUDED.core_last_unknown_at, core_health = EXCLUDED.core_health;

-- name: forget_replica
-- A replica that stops cleanly leaves the list at once.
DELETE FROM queue_replicas WHERE replica_id = %(replica_id)s;

-- name: replicas
-- The replicas heard from within the last hour, the longest running first.
SELECT replica_id, host, start_time, heartbeat_time, draining, calls_in_flight, watch_streams, overview_streams,
       core_answered, core_refused, core_unknown, core_last_unknown_at, core_health, clock_timestamp() AS read_time
  FROM queue_replicas
 WHERE heartbeat_time >= clock_timestamp() - interval '1 hour'
 ORDER BY start_time, replica_id;

-- name: fresh_core_health_reports
-- The core's health as each replica heard from within `fresh_seconds` reads it (the Overview's
-- CoreHealth), and when they were read (one row with a NULL report when none is fresh).
SELECT r.core_health, c.read_time
  FROM (SELECT clock_timestamp() AS read_time) c
  LEFT JOIN queue_replicas r
         ON r.heartbeat_time >= c.read_time - make_interval(secs => %(fresh_seconds)s) AND r.core_health IS NOT NULL;

-- name: admits_per_minute
-- Admits per minute over the window, oldest minute first, empty minutes included.
SELECT count(j.job_id) AS admits
  FROM generate_series(date_trunc('minute', clock_timestamp()) - make_interval(mins => %(window_minutes)s - 1),
                       date_trunc('minute', clock_timestamp()),
                       interval '1 minute') AS minute
  LEFT JOIN analysis_jobs j
         ON j.create_time >= minute AND j.create_time < minute + interval '1 minute'
 GROUP BY minute
 ORDER BY minute;

-- name: record_operator_action
-- An operator's Promote, Release or CheckJobWithCore, for the audit timeline (migration 0035).
INSERT INTO queue_operator_actions (action, actor, user_id, job_id, outcome)
VALUES (%(action)s, %(actor)s, %(user_id)s, %(job_id)s, left(%(outcome)s, 512));

-- name: audit_events
-- One page of the audit timeline, newest first (keyset on the event's time and key, below
-- `before_time`/`before_key` when set): each source read newest first off its own index (migration
-- 0035) and cut to a page, then merged. Filtered by actor and by user ('' for either: all).
WITH settings AS (
    SELECT s.create_time AS occurred_at, 'setting:' || lpad(s.change_id::text, 19, '0') AS event_key,
           CASE s.setting WHEN 'core_capacity' THEN 'capacity' WHEN 'user_max_active' THEN 'user_limit'
                ELSE CASE WHEN s.new_value = 1 THEN 'pause' ELSE 'resume' END END AS kind,
           s.actor, COALESCE(s.user_id, '') AS user_id, NULL::uuid AS job_id, NULL::uuid AS retry_of_job_id,
           COALESCE(s.old_value, 0)::bigint AS old_value, COALESCE(s.new_value, 0)::bigint AS new_value,
           0::bigint AS amount, s.note, '' AS outcome
      FROM queue_setting_changes s
     WHERE (%(actor)s = '' OR s.actor = %(actor)s)
       AND (%(user_id)s = '' OR s.user_id = %(user_id)s)
       AND (%(before_time)s::timestamptz IS NULL OR s.create_time <= %(before_time)s::timestamptz)
     ORDER BY s.create_time DESC, s.change_id DESC
     LIMIT %(limit)s
),
grants AS (
    SELECT g.create_time, 'grant:' || lpad(g.entry_id::text, 19, '0'), 'grant', g.actor, g.user_id, NULL::uuid, NULL::uuid,
           0::bigint, 0::bigint, g.amount, COALESCE(g.note, ''), ''
      FROM credit_ledger g
     WHERE g.kind = 'grant'
       AND (%(actor)s = '' OR g.actor = %(actor)s)
       AND (%(user_id)s = '' OR g.user_id = %(user_id)s)
       AND (%(before_time)s::timestamptz IS NULL OR g.create_time <= %(before_time)s::timestamptz)
     ORDER BY g.create_time DESC, g.entry_id DESC
     LIMIT %(limit)s
),
cancels AS (
    SELECT COALESCE(c.cancel_requested_at, c.end_time), 'cancel:' || c.job_id::text, 'cancel', c.canceled_by, c.user_id, c.job_id,
           NULL::uuid, 0::bigint, 0::bigint, 0::bigint, '', c.status
      FROM analysis_jobs c
     WHERE c.canceled_by IS NOT NULL
       AND (%(actor)s = '' OR c.canceled_by = %(actor)s)
       AND (%(user_id)s = '' OR c.user_id = %(user_id)s)
       AND (%(before_time)s::timestamptz IS NULL OR COALESCE(c.cancel_requested_at, c.end_time) <= %(before_time)s::timestamptz)
     ORDER BY COALESCE(c.cancel_requested_at, c.end_time) DESC, c.job_id DESC
     LIMIT %(limit)s
),
retries AS (
    SELECT r.create_time, 'retry:' || r.job_id::text, 'retry',
           COALESCE((SELECT l.actor FROM credit_ledger l WHERE l.job_id = r.job_id AND l.kind = 'charge'), 'unknown'),
           r.user_id, r.job_id, r.retry_of_job_id, 0::bigint, 0::bigint, 0::bigint, '', r.status
      FROM analysis_jobs r
     WHERE r.retry_of_job_id IS NOT NULL
       AND (%(actor)s = '' OR EXISTS (SELECT 1 FROM credit_ledger l WHERE l.job_id = r.job_id AND l.kind = 'charge' AND l.actor = %(actor)s))
       AND (%(user_id)s = '' OR r.user_id = %(user_id)s)
       AND (%(before_time)s::timestamptz IS NULL OR r.create_time <= %(before_time)s::timestamptz)
     ORDER BY r.create_time DESC, r.job_id DESC
     LIMIT %(limit)s
),
actions AS (
    SELECT a.create_time, 'action:' || lpad(a.action_id::text, 19, '0'), a.action, a.actor, a.user_id, a.job_id, NULL::uuid,
           0::bigint, 0::bigint, 0::bigint, '', a.outcome
      FROM queue_operator_actions a
     WHERE (%(actor)s = '' OR a.actor = %(actor)s)
       AND (%(user_id)s = '' OR a.user_id = %(user_id)s)
       AND (%(before_time)s::timestamptz IS NULL OR a.create_time <= %(before_time)s::timestamptz)
     ORDER BY a.create_time DESC, a.action_id DESC
     LIMIT %(limit)s
)
SELECT * FROM (
    SELECT * FROM settings UNION ALL SELECT * FROM grants UNION ALL SELECT * FROM cancels
    UNION ALL SELECT * FROM retries UNION ALL SELECT * FROM actions
) AS events
 WHERE %(before_time)s::timestamptz IS NULL OR (occurred_at, event_key) < (%(before_time)s::timestamptz, %(before_key)s::text)
 ORDER BY occurred_at DESC, event_key DESC
 LIMIT %(limit)s;
