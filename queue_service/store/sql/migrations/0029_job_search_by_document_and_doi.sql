-- The operator's search in what jobs judge (OperatorService.SearchJobs: JobFilter's document uri
-- prefix, title words and source DOI), each read from its own index so a search costs the same at a
-- million jobs. Whoever has a lecturer on the phone holds a thesis title or a DOI, not a job id.
--
-- The keys live in a table of their own, `analysis_job_search_keys`, one row per job written once
-- at insert and never updated: a job's own row is rewritten at every step of its life, never as a
-- HOT update (its status is indexed), so every index on `analysis_jobs` takes a new entry at each
-- step. Kept there, two GIN indexes and a uri index would have cost every admit, promotion,
-- release and completion an entry each (measured: PostgreSQL CPU per completed job 1.28x the
-- round's baseline with them on the job row).
--
-- The document's uri and title stay with the job row for as long as it is kept; its `sources` do
-- not (the pruner empties them after QUEUE_JOB_INPUTS_RETENTION_SECONDS). So the DOIs are kept in
-- `source_dois`: each distinct DOI of the job's sources, lowercased (DOIs are case-insensitive).
-- The title's words are kept as a tsvector, `title_words` ('simple' configuration: no stemming, no
-- stop words, so every word of a title is findable, in any language): computed per row instead,
-- a search the planner answers by walking the newest jobs (common words) spent most of its time
-- in to_tsvector (190 ms for 21 rows at a million jobs). The row is written by the trigger
-- `analysis_jobs_keep_search_keys` (functions/), so every path that inserts a job (an admit of
-- this version or of the previous one, a retry) writes it; the pruner deletes it in the statement
-- that deletes the job (no foreign key: its checks would run at every update of the job row, and a
-- key whose job is gone matches nothing, since every search joins the job).
--
-- Indexes, built-in only (the embedded and Debian's PostgreSQL both ship them):
-- * GIN over `source_dois` (`@>`: jobs citing a DOI);
-- * GIN over `title_words` (`@@`: titles holding every word);
-- * btree over the uri in the "C" collation, so a prefix is a range of the index whatever the
--   database's collation.
--
-- The backfill writes the keys of the jobs already there: the DOIs from their sources while they
-- hold them, else from the preview kept after pruning (its first 10 sources: all a pruned job
-- still knows). Additive for running replicas: none of their queries reads the new table.

CREATE TABLE analysis_job_search_keys (
    job_id       uuid PRIMARY KEY,
    document_uri text,
    source_dois  text[] NOT NULL,
    title_words  tsvector NOT NULL
);

INSERT INTO analysis_job_search_keys (job_id, document_uri, source_dois, title_words)
SELECT j.job_id, j.document_uri,
       ARRAY(SELECT DISTINCT lower(s.e->>'doi')
               FROM jsonb_array_elements(COALESCE(j.sources, j.sources_preview, '[]'::jsonb)) AS s(e)
              WHERE COALESCE(s.e->>'doi', '') <> ''),
       to_tsvector('simple'::regconfig, COALESCE(j.document_title, ''))
  FROM analysis_jobs j
 WHERE COALESCE(j.sources, j.sources_preview) IS NOT NULL OR j.document_title IS NOT NULL OR j.document_uri IS NOT NULL;

CREATE INDEX analysis_job_search_keys_by_source_doi ON analysis_job_search_keys USING gin (source_dois);

CREATE INDEX analysis_job_search_keys_by_title_words ON analysis_job_search_keys USING gin (title_words);

CREATE INDEX analysis_job_search_keys_by_document_uri ON analysis_job_search_keys (document_uri COLLATE "C");

-- Statistics at once: without them the planner guesses a DOI matches 0.5% of the keys and walks
-- every job instead of the index (2.1 s at a million jobs, against 0.28 ms with them).
ANALYZE analysis_job_search_keys;
