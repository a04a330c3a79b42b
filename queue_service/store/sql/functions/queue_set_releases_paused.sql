-- queue_set_releases_paused: the function (two overloads).
--
-- Why, migration by migration (its text below is the last one's):
-- * 0028 (release pauses and ledger actor): Pauses or resumes the releases of the fleet
--   (`p_user_id` '') or of one user, recorded as a `releases_paused` setting change with its actor
--   and note. Run under the fleet-wide capacity lock (`locks.capacity_section`), so a grant either
--   committed before the pause (its releases are on their way, like runs at the core) or sees it.
--   A call that changes nothing (a pause already in force, a resume of no pause) records nothing
--   and returns no row; otherwise one 'changed' row with the change.
-- * 0034 (release turn attempt): A pause holds releases, never the count: a release retry that may
--   have been applied at the core is held with its capacity (`claim_due_releases`,
--   `hold_release_if_paused`: PENDING, `next_release_at` NULL, not waiting for capacity). A resume
--   makes those of the users it frees due at once, in the same commit, each with a release window
--   of `p_release_window_seconds` from now at least (its window did not run while held). The
--   four-argument overload (replicas of the previous version) resumes them too, their windows as
--   they were.
-- * 0040 (the seat's release fence and timer): the resume's due retries are queue_seat_resume's.

CREATE OR REPLACE FUNCTION public.queue_set_releases_paused(p_user_id text, p_paused boolean, p_actor text, p_note text, p_release_window_seconds double precision)
 RETURNS TABLE(row_kind text, change_id bigint, setting text, user_id text, old_value integer, new_value integer, actor text, create_time timestamptz, note text)
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF p_paused THEN
        INSERT INTO queue_release_pauses AS p (user_id, paused_by, note) VALUES (p_user_id, p_actor, p_note)
        ON CONFLICT ON CONSTRAINT queue_release_pauses_pkey DO NOTHING;
    ELSE
        DELETE FROM queue_release_pauses p WHERE p.user_id = p_user_id;
    END IF;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF NOT p_paused THEN
        -- The retries the pause held (their runs may judge: they kept their capacity) are due now.
        PERFORM queue_seat_resume(p_user_id, p_release_window_seconds);
    END IF;
    RETURN QUERY
    INSERT INTO queue_setting_changes AS c (setting, user_id, old_value, new_value, actor, note)
    VALUES ('releases_paused', NULLIF(p_user_id, ''), CASE WHEN p_paused THEN 0 ELSE 1 END,
            CASE WHEN p_paused THEN 1 ELSE 0 END, p_actor, p_note)
    RETURNING 'changed'::text, c.change_id, c.setting, c.user_id, c.old_value, c.new_value, c.actor, c.create_time, c.note;
END
$function$;

CREATE OR REPLACE FUNCTION public.queue_set_releases_paused(p_user_id text, p_paused boolean, p_actor text, p_note text)
 RETURNS TABLE(row_kind text, change_id bigint, setting text, user_id text, old_value integer, new_value integer, actor text, create_time timestamptz, note text)
 LANGUAGE sql
AS $function$
    SELECT * FROM queue_set_releases_paused(p_user_id, p_paused, p_actor, p_note, NULL::double precision)
$function$;
