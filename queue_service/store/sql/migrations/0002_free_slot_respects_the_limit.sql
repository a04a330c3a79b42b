-- A user's limit may be lowered while they hold higher-numbered slots: a free low slot must
-- then stay empty until the number of active first-pass jobs is below the new limit (I1).
CREATE OR REPLACE FUNCTION analysis_jobs_free_slot(p_user_id text, p_default_max_active integer) RETURNS integer
LANGUAGE sql STABLE AS $$
    WITH lim AS (
        SELECT COALESCE((SELECT l.max_active FROM user_queue_limits l WHERE l.user_id = p_user_id),
                        p_default_max_active) AS max_active
    ),
    active AS (
        SELECT a.slot FROM analysis_jobs a
         WHERE a.user_id = p_user_id AND a.status IN ('pending', 'running') AND a.delta_of_job_id IS NULL
    )
    SELECT s
      FROM lim, generate_series(1, lim.max_active) AS s
     WHERE (SELECT count(*) FROM active) < lim.max_active
       AND s NOT IN (SELECT slot FROM active)
     ORDER BY s
     LIMIT 1
$$;
