-- queue_doi_search_key: a DOI as the job search matches it.
--
-- Why, migration by migration (its text below is the last one's):
-- * 0036 (DOIs found as they read): the DOI lowercased (DOIs are case-insensitive) and without
--   the characters that show as nothing, the set validation.py refuses as invisible (format
--   characters, C1 controls, U+2028/U+2029, the Hangul fillers; tests/unit checks the two lists
--   agree). A DOI stored before the service refused them, "10.1234/ab\u200Bc", reads as
--   "10.1234/abc", and that is what an operator types (a search holding such a character is
--   refused); kept as stored, its job could be found by no search at all. '' for a DOI of such
--   characters only. The job keeps its DOIs as stored; only the search keys hold this form.

CREATE OR REPLACE FUNCTION public.queue_doi_search_key(doi text)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE STRICT
AS $function$
    SELECT lower(regexp_replace(doi, '[\u0080-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u115f-\u1160\u180e\u200b-\u200f\u2028-\u2029\u202a-\u202e\u2060-\u2064\u2066-\u206f\u3164\ufeff\uffa0\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]', '', 'g'))
$function$;
