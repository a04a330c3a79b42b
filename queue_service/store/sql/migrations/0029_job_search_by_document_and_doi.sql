-- The operator's search in what jobs judge (OperatorService.SearchJobs: JobFilter's document uri
-- prefix, title words and source DOI), each read from its own index so a search costs the same at a
-- million jobs. Whoever has a lecturer on the phone holds a thesis title or a DOI, not a job id.
--
-- The document's uri and title stay with the job row for as long as it is kept; its `sources` do
-- not (the pruner empties them after QUEUE_JOB_INPUTS_RETENTION_SECONDS). So the DOIs are kept in
-- `source_dois`: each distinct DOI of the job's sources, lowercased (DOIs are case-insensitive).
-- The title's words are kept as a tsvector, `title_words` ('simple' configuration: no stemming, no
-- stop words, so every word of a title is findable, in any language): computed per row instead,
-- a search the planner answers by walking the newest jobs (common words) spent most of its time
-- in to_tsvector (190 ms for 21 rows at a million jobs). Both are written at insert by the trigger
-- `analysis_jobs_keep_search_keys` (functions/), so every path that inserts a job (an admit of
-- this version or of the previous one, a retry) fills them.
--
-- Indexes, built-in only (the embedded and Debian's PostgreSQL both ship them):
-- * GIN over `source_dois` (`@>`: jobs citing a DOI);
-- * GIN over `title_words` (`@@`: titles holding every word);
-- * btree over the uri in the "C" collation, so a prefix is a range of the index whatever the
--   database's collation.
--
-- The backfill writes both for the jobs already there: the DOIs from their sources while they
-- hold them, else from the preview kept after pruning (its first 10 sources: all a pruned job
-- still knows). It rewrites each row once (no trigger announces it: none of the columns they
-- watch changes). Additive for running replicas: none of their queries reads the new columns.

ALTER TABLE analysis_jobs ADD COLUMN source_dois text[], ADD COLUMN title_words tsvector;

UPDATE analysis_jobs j
   SET source_dois = ARRAY(SELECT DISTINCT lower(s.e->>'doi')
                             FROM jsonb_array_elements(COALESCE(j.sources, j.sources_preview, '[]'::jsonb)) AS s(e)
                            WHERE COALESCE(s.e->>'doi', '') <> ''),
       title_words = to_tsvector('simple'::regconfig, COALESCE(j.document_title, ''))
 WHERE COALESCE(j.sources, j.sources_preview) IS NOT NULL OR j.document_title IS NOT NULL;

CREATE INDEX analysis_jobs_by_source_doi ON analysis_jobs USING gin (source_dois);

CREATE INDEX analysis_jobs_by_title_words ON analysis_jobs USING gin (title_words);

CREATE INDEX analysis_jobs_by_document_uri ON analysis_jobs (document_uri COLLATE "C");
