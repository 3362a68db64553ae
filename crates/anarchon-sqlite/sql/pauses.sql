-- Every pause.
SELECT scope, since, until, reason, paused_by FROM {prefix}_pauses;
