-- analysis_jobs_keep_source_dois: the function and its trigger of the same name.
--
-- Why, migration by migration (its text below is the last one's, as schema.sql shows it):
-- * 0029 (job search by document and DOI): A job's DOIs stay searchable for as long as its row is
--   kept, after its sources are pruned: each distinct DOI of its sources, lowercased (DOIs are
--   case-insensitive), written at insert whichever code inserts the job (as the migration's
--   backfill does for the jobs before it).

CREATE OR REPLACE FUNCTION public.analysis_jobs_keep_source_dois()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    NEW.source_dois := ARRAY(SELECT DISTINCT lower(s.e->>'doi')
                               FROM jsonb_array_elements(NEW.sources) AS s(e)
                              WHERE COALESCE(s.e->>'doi', '') <> '');
    RETURN NEW;
END
$function$;

DROP TRIGGER IF EXISTS analysis_jobs_keep_source_dois ON public.analysis_jobs;
CREATE TRIGGER analysis_jobs_keep_source_dois BEFORE INSERT ON analysis_jobs FOR EACH ROW WHEN (new.sources IS NOT NULL) EXECUTE FUNCTION analysis_jobs_keep_source_dois();
