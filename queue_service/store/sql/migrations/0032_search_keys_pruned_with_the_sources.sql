-- The search keys pruned with the sources: a job's DOIs in `analysis_job_search_keys` are those
-- it still holds. The trigger `analysis_jobs_trim_search_keys` (functions/) cuts them to the
-- preview's (its first 10 sources) when the pruner empties its sources; this cuts the keys of the
-- jobs pruned before it the same way, as migration 0029's backfill wrote them for the jobs pruned
-- before that. Kept whole, every DOI of up to 1 000 sources stayed for the job's 30 days with its
-- GIN entries (docs/security.md, "What one user can store").
--
-- One UPDATE of the pruned jobs whose keys hold more than their preview's DOIs (each such job
-- once); the pruner's batches meanwhile take their own row locks. Additive for running replicas:
-- their searches read the same columns, and find a pruned job by the DOIs its detail shows.

UPDATE analysis_job_search_keys k
   SET source_dois = ARRAY(SELECT DISTINCT lower(s.e->>'doi')
                             FROM jsonb_array_elements(COALESCE(j.sources_preview, '[]'::jsonb)) AS s(e)
                            WHERE COALESCE(s.e->>'doi', '') <> '')
  FROM analysis_jobs j
 WHERE j.job_id = k.job_id AND j.sources IS NULL AND cardinality(k.source_dois) > jsonb_array_length(COALESCE(j.sources_preview, '[]'::jsonb));
