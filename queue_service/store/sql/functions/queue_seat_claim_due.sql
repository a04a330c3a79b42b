-- queue_seat_claim_due: the function.
--
-- The capacity seat of the releases that fell due, for the dispatcher's pass (README.md, "The
-- capacity seat").
--
-- Why, migration by migration (its text below is the last one's):
-- * Text only, no migration (after 0041): the two statements of the dispatcher's claim since
--   0039, `hold_paused_due_releases` then `claim_due_releases`, in one call (one round trip and one
--   commit a pass, as before 0039). First, while any pause is in force, the due releases a pause
--   holds are taken out (queue_seat_hold_for_pause: a retry or a lease that fell due during the
--   pause is not claimed; one whose due attempt would still follow no release since it last
--   waited waits for a grant again, any other keeps its place with its retry held until the
--   resume or a cancel makes it due). Then up to `p_batch_size` due releases are claimed
--   (queue_seat_claim), earliest due first, skipping rows another replica holds; a job whose user
--   asked to cancel it is claimed even while paused (its run is canceled). One row per job:
--   'held' (the job only) or 'claimed' (with what the release needs).

CREATE OR REPLACE FUNCTION public.queue_seat_claim_due(p_batch_size integer, p_lease_seconds double precision)
 RETURNS TABLE(row_kind text, job_id uuid, user_id text, run_id uuid, release_attempts integer, cancel_requested boolean, delta boolean)
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF EXISTS (SELECT 1 FROM queue_release_pauses) THEN
        RETURN QUERY
        SELECT 'held'::text, h.job_id, NULL::text, NULL::uuid, NULL::integer, NULL::boolean, NULL::boolean
          FROM queue_seat_hold_for_pause(
                   ARRAY(SELECT a.job_id FROM analysis_jobs a
                          WHERE a.status = 'pending' AND a.next_release_at <= clock_timestamp()
                            AND a.cancel_requested_at IS NULL AND queue_releases_paused(a.user_id)
                          LIMIT p_batch_size
                          FOR UPDATE SKIP LOCKED),
                   false) AS h;
    END IF;
    RETURN QUERY
    SELECT 'claimed'::text, c.job_id, c.user_id, c.run_id, c.release_attempts, c.cancel_requested, c.delta
      FROM queue_seat_claim(
               ARRAY(SELECT a.job_id FROM analysis_jobs a
                      WHERE a.status = 'pending' AND a.next_release_at <= clock_timestamp()
                        AND (NOT EXISTS (SELECT 1 FROM queue_release_pauses) OR a.cancel_requested_at IS NOT NULL
                             OR NOT queue_releases_paused(a.user_id))
                      ORDER BY a.next_release_at
                      LIMIT p_batch_size
                      FOR UPDATE SKIP LOCKED),
               p_lease_seconds) AS c;
END
$function$;
