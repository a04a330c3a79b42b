-- DOIs found as they read: the search keys of a DOI holding characters that show as nothing
-- (stored before the service refused them) lose those characters, as
-- `queue_doi_search_key` (functions/) writes the keys of the jobs inserted or pruned after it
-- (the triggers `analysis_jobs_keep_search_keys` and `analysis_jobs_trim_search_keys`). Kept as
-- stored, such a DOI was found by no search: the one an operator types as it reads lacks the
-- character, and a search holding one is refused. The class below is that function's (migrations
-- run before the files of functions/, so it is written out here).
--
-- One UPDATE of the keys that hold such a character (a scan of the keys once; none are written
-- for jobs admitted since validation refused them). Additive for running replicas: their searches
-- read the same column, and a DOI typed as it reads now finds the job.

UPDATE analysis_job_search_keys
   SET source_dois = ARRAY(SELECT DISTINCT key
                             FROM (SELECT regexp_replace(doi, '[\u0080-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u115f-\u1160\u180e\u200b-\u200f\u2028-\u2029\u202a-\u202e\u2060-\u2064\u2066-\u206f\u3164\ufeff\uffa0\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]', '', 'g') AS key
                                     FROM unnest(source_dois) AS doi) AS keys
                            WHERE key <> '')
 WHERE array_to_string(source_dois, ' ') ~ '[\u0080-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u115f-\u1160\u180e\u200b-\u200f\u2028-\u2029\u202a-\u202e\u2060-\u2064\u2066-\u206f\u3164\ufeff\uffa0\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]';
