-- queue_capacity_waiting_after: the function.
--
-- Why, migration by migration (its text below is the last one's):
-- * Text only, no migration (after 0040): one step of queue_capacity_first_waiting's walk (0023,
--   0028), moved out of it: the next job waiting for a grant after (`p_key`, `p_wait`, `p_seq`)
--   in turn order (the first when `p_seq` is NULL: a job's `queue_seq` never is, while its turn
--   key may be), of one kind (`p_deltas_only`) or of both,
--   passing over the skipped jobs and the paused users. Each of the four queries is spelled so
--   that its partial index serves it (a row comparison with a NULL bound, or an OR between
--   kinds, would not be). No row when none waits.

CREATE OR REPLACE FUNCTION public.queue_capacity_waiting_after(p_deltas_only boolean, p_skipped uuid[], p_paused text[], p_key timestamp with time zone, p_wait timestamp with time zone, p_seq bigint)
 RETURNS TABLE(job_id uuid, user_id text, turn_key timestamp with time zone, wait_since timestamp with time zone, queue_seq bigint)
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF p_deltas_only AND p_seq IS NULL THEN
        RETURN QUERY
        SELECT w.job_id, w.user_id, w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
          FROM analysis_jobs w
         WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL
           AND w.delta_of_job_id IS NOT NULL AND w.job_id <> ALL (p_skipped) AND w.user_id <> ALL (p_paused)
         ORDER BY w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
         LIMIT 1;
    ELSIF p_deltas_only THEN
        RETURN QUERY
        SELECT w.job_id, w.user_id, w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
          FROM analysis_jobs w
         WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL
           AND w.delta_of_job_id IS NOT NULL AND w.job_id <> ALL (p_skipped) AND w.user_id <> ALL (p_paused)
           AND (w.capacity_turn_key, w.capacity_wait_since, w.queue_seq) > (p_key, p_wait, p_seq)
         ORDER BY w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
         LIMIT 1;
    ELSIF p_seq IS NULL THEN
        RETURN QUERY
        SELECT w.job_id, w.user_id, w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
          FROM analysis_jobs w
         WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL
           AND w.job_id <> ALL (p_skipped) AND w.user_id <> ALL (p_paused)
         ORDER BY w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
         LIMIT 1;
    ELSE
        RETURN QUERY
        SELECT w.job_id, w.user_id, w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
          FROM analysis_jobs w
         WHERE w.status = 'pending' AND w.capacity_wait_since IS NOT NULL AND w.capacity_token IS NULL
           AND w.job_id <> ALL (p_skipped) AND w.user_id <> ALL (p_paused)
           AND (w.capacity_turn_key, w.capacity_wait_since, w.queue_seq) > (p_key, p_wait, p_seq)
         ORDER BY w.capacity_turn_key, w.capacity_wait_since, w.queue_seq
         LIMIT 1;
    END IF;
END
$function$;
