-- analysis_jobs_free_slot: the function.
--
-- Why, migration by migration (its text below is the last one's):
-- * 0001 (queue and credits): The lowest free first-pass slot of a user (NULL when all are taken).
--   Shared by admit and promotion so both decide the same way.
-- * 0002 (free slot respects the limit): A user's limit may be lowered while they hold
--   higher-numbered slots: a free low slot must then stay empty until the number of active
--   first-pass jobs is below the new limit (I1).
-- * 0003 (settled runs): Replaces 0002's definition: slot holders now include ended jobs whose run
--   is not settled.

CREATE OR REPLACE FUNCTION public.analysis_jobs_free_slot(p_user_id text, p_default_max_active integer)
 RETURNS integer
 LANGUAGE sql
 STABLE
AS $function$
    WITH lim AS (
        SELECT COALESCE((SELECT l.max_active FROM user_queue_limits l WHERE l.user_id = p_user_id),
                        p_default_max_active) AS max_active
    ),
    holders AS (
        SELECT a.slot FROM analysis_jobs a
         WHERE a.user_id = p_user_id AND a.delta_of_job_id IS NULL AND a.slot IS NOT NULL
           AND (a.status IN ('pending', 'running') OR a.run_settle_due_at IS NOT NULL)
    )
    SELECT s
      FROM lim, generate_series(1, lim.max_active) AS s
     WHERE (SELECT count(*) FROM holders) < lim.max_active
       AND s NOT IN (SELECT slot FROM holders)
     ORDER BY s
     LIMIT 1
$function$;
