-- queue_capacity_probe_taken: the function.
--
-- Why, migration by migration (its text below is the last one's):
-- * 0014 (fleet capacity): The core took a release above the limit it had taught us: the limit
--   grows by one (additive increase), and is forgotten once it reaches the configured capacity.

CREATE OR REPLACE FUNCTION public.queue_capacity_probe_taken()
 RETURNS void
 LANGUAGE sql
AS $function$
    UPDATE queue_capacity
       SET core_limit = CASE WHEN capacity > 0 AND core_limit + 1 >= capacity THEN NULL ELSE core_limit + 1 END,
           next_probe_at = NULL
     WHERE core_limit IS NOT NULL
$function$;
