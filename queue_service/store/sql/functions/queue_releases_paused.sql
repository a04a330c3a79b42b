-- queue_releases_paused: the function.
--
-- Why, migration by migration (its text below is the last one's):
-- * 0028 (release pauses and ledger actor): Whether a user's runs are held back from the core now:
--   the fleet-wide pause (the row keyed '') or the user's own. Read by the capacity trigger (a job
--   entering PENDING then waits for a grant), the grant (which hands nothing to a paused user),
--   the claim of due releases (which sends a paused user's due release back to waiting) and the
--   admit (a delta's run is then created held). Two primary-key probes.

CREATE OR REPLACE FUNCTION public.queue_releases_paused(p_user_id text)
 RETURNS boolean
 LANGUAGE sql
 STABLE
AS $function$
    SELECT EXISTS (SELECT 1 FROM queue_release_pauses p WHERE p.user_id = '' OR p.user_id = p_user_id)
$function$;
