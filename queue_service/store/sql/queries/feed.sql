-- The job-change feed (store/feed.py): where a reader starts, what it reads since, the horizon
-- the trimmer keeps, the trim, and the wake-up hint.

-- name: job_feed_start
-- Where a reader of the job-change feed starts: the present snapshot (store/feed.py).
SELECT pg_current_snapshot()::text AS snapshot;

-- name: job_feed_since
-- The feed's rows that the previous read's snapshot (`after`) could not see, written by a
-- transaction in flight then (its xip list) or not yet begun (an xid at or past its xmax), and
-- this statement's snapshot, the next read's `after`. `pg_current_snapshot()` is the statement's
-- own snapshot, the one the rows are read with, so a row of a transaction still in flight is not
-- passed over: it is not visible, and its xid stays in the next `after`. Only rows of the
-- watched users and of PENDING jobs nobody claimed, unless `all_users`. The first row carries the
-- snapshot even when no change came, and, when `watch_line`, whether any of the new rows, of any
-- user, may have moved the fleet's line for capacity (`line_moved`: a job that is or was PENDING
-- or RUNNING changed; the first such row answers it).
SELECT now_snapshot.snapshot::text AS snapshot, now_snapshot.line_moved,
       f.change_id, f.job_id, f.user_id, f.status, f.old_status,
       f.release_claimed, extract(epoch FROM clock_timestamp() - f.change_time)::float8 AS lag_seconds
  FROM (SELECT pg_current_snapshot() AS snapshot,
               %(watch_line)s AND EXISTS (
                   SELECT 1 FROM analysis_job_feed m
                    WHERE (m.xid >= pg_snapshot_xmax(%(after)s::pg_snapshot)
                           OR m.xid = ANY(ARRAY(SELECT pg_snapshot_xip(%(after)s::pg_snapshot))))
                      AND (m.status IN ('pending', 'running') OR m.old_status IN ('pending', 'running'))) AS line_moved
       ) AS now_snapshot
  LEFT JOIN LATERAL (
      SELECT c.change_id, c.job_id, c.user_id, c.status, c.old_status, c.release_claimed, c.change_time
        FROM analysis_job_feed c
       WHERE (c.xid >= pg_snapshot_xmax(%(after)s::pg_snapshot)
              OR c.xid = ANY(ARRAY(SELECT pg_snapshot_xip(%(after)s::pg_snapshot))))
         AND (%(all_users)s OR c.user_id = ANY(%(user_ids)s::text[]) OR (c.status = 'pending' AND NOT c.release_claimed))
       ORDER BY c.change_id
       LIMIT %(limit)s
  ) AS f ON true
 ORDER BY f.change_id;

-- name: job_feed_horizon
-- The oldest transaction still in flight: every transaction with a smaller id has ended.
SELECT pg_snapshot_xmin(pg_current_snapshot())::text AS xmin;

-- name: trim_job_feed
-- Deletes up to `batch_size` feed rows of transactions older than `before_xid` (the sweeper's
-- mark of a horizon at least the feed's retention old: every reader has read them).
DELETE FROM analysis_job_feed f
 WHERE f.ctid = ANY(ARRAY(SELECT c.ctid FROM analysis_job_feed c
                           WHERE c.xid < %(before_xid)s::xid8
                           ORDER BY c.xid
                           LIMIT %(batch_size)s));

-- name: job_feed_hint
-- A wake-up hint for the other replicas' feed readers, in a transaction of its own (no WAL, so the
-- notify lock is held only for its queueing), after a change of this replica committed.
SELECT pg_notify('analysis_job_feed', %(sender)s);
