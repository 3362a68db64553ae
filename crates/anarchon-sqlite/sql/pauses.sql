-- Every pause.
SELECT scope, since, until, reason, by FROM {prefix}_pauses;
