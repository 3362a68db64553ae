-- The claim, as one server-side function: the lease decision of
-- `decide::claim` (anarchon-core), which it mirrors step for step, applied
-- to a batch of runs in one statement, so a claim costs one round trip and
-- one transaction. The arrays are the claims' fields, element i of each
-- belonging to claim i; `p_overlap` holds each claim's overlap rule by name
-- (`allow`, `skip`, `replace`, `buffer-one`). One row comes back per claim,
-- r_idx telling which.
-- A win comes back with the run's past attempts (`r_earlier`, the JSON
-- array of the `earlier` column as the step left it; NULL for none), from
-- which the caller tells the winner how its attempt came to run.
--
-- This file is not a migration: it is always the current function, and
-- every migration run that brings a table to the current schema version
-- installs it (see `src/migrate.rs`). Change it here, and add a schema
-- version without a table step so that stores on the old version reinstall
-- it when they open.
--
-- `{{table}}` is replaced with the store's validated table name.

CREATE OR REPLACE FUNCTION "{{table}}_claim"(
    p_job          text[],
    p_slot         bigint[],
    p_token        uuid[],
    p_instance     text[],
    p_max_late     bigint[],
    p_lease        bigint[],
    p_overlap      text[],
    p_max_attempts integer[],
    p_rerun_paused boolean[]
)
RETURNS TABLE (
    r_idx         integer,
    r_outcome     text,
    r_attempt     integer,
    r_fence       bigint,
    r_lease_until bigint,
    r_store_now   bigint,
    r_earlier     text
)
LANGUAGE plpgsql
VOLATILE
AS $claim$
DECLARE
    n       integer := coalesce(array_length(p_job, 1), 0);
    v_job   text;
    v_slot  bigint;
    v_now   bigint;
    v_found boolean;
    v_fence bigint;
    v_until bigint;
    v_run   record;
    v_window bigint;
    v_earlier jsonb;
    v_waiting boolean;
    v_step  text;
    v_slow  boolean[] := array_fill(false, ARRAY[n]);
    v_any_slow boolean := false;
    -- Whether every claim that took the job's lock only read (see the end).
    v_window_kept boolean := true;
    v_read_only boolean;
    v_all_read_only boolean := true;
BEGIN
    IF coalesce(array_length(p_slot, 1), 0) <> n
        OR coalesce(array_length(p_token, 1), 0) <> n
        OR coalesce(array_length(p_instance, 1), 0) <> n
        OR coalesce(array_length(p_max_late, 1), 0) <> n
        OR coalesce(array_length(p_lease, 1), 0) <> n
        OR coalesce(array_length(p_overlap, 1), 0) <> n
        OR coalesce(array_length(p_max_attempts, 1), 0) <> n
        OR coalesce(array_length(p_rerun_paused, 1), 0) <> n
    THEN
        RAISE EXCEPTION 'anarchon: the claim arrays differ in length' USING ERRCODE = '22023';
    END IF;
    -- Each claim's overlap rule, by the name `Overlap::as_str` (anarchon-core)
    -- gives it. A name this function does not know fails the whole batch
    -- before anything is written.
    IF EXISTS (
        SELECT 1
          FROM unnest(p_overlap) AS u(rule)
         WHERE u.rule IS NULL OR u.rule NOT IN ('allow', 'skip', 'replace', 'buffer-one')
    ) THEN
        RAISE EXCEPTION 'anarchon: unknown overlap rule' USING ERRCODE = '22023';
    END IF;

    -- 0. Claims that the run's own row answers, without the job's lock: a
    -- run that ended for good, one someone else holds with a live lease,
    -- our own claim sent again, and a failure whose retry is not due.
    -- None of them writes, so they need no order among the job's claims.
    -- The rows of the whole batch are read by one query (one snapshot,
    -- taken when it starts), and the time of each answer is read after
    -- that, so the answer held at that moment (a lease live now was live
    -- then). This is what the instances that lose a race, and backups
    -- watching a run, ask; only claims that may change something (a slot
    -- nobody ran, a lease that ran out, a retry that is due) go on to the
    -- job's lock, as does a claim whose job has not yet recorded its late
    -- window.
    FOR v_run IN
        SELECT u.i::integer AS i, t.job IS NOT NULL AS found,
               t.state, t.attempt, t.token, t.fence, t.lease_until, t.retry_at,
               t.earlier,
               coalesce((SELECT j.late_window >= u.max_late
                           FROM "{{table}}_jobs" AS j
                          WHERE j.job = u.job), false) AS window_kept
          FROM unnest(p_job, p_slot, p_max_late) WITH ORDINALITY AS u(job, slot, max_late, i)
          LEFT JOIN "{{table}}" AS t ON t.job = u.job AND t.slot = u.slot
         ORDER BY u.i
    LOOP
        v_found := v_run.found;
        v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
        r_idx := v_run.i;
        r_outcome := NULL;
        r_attempt := NULL;
        r_fence := NULL;
        r_lease_until := NULL;
        r_store_now := v_now;
        r_earlier := NULL;
        IF NOT v_found OR NOT v_run.window_kept
           OR v_run.state IN ('missed', 'waiting')
           OR (v_run.state = 'paused' AND p_rerun_paused[v_run.i]) THEN
            NULL;
        ELSIF v_run.state = 'failed' AND v_run.retry_at IS NOT NULL THEN
            IF v_now < v_run.retry_at THEN
                r_outcome := 'running';
                r_lease_until := v_run.retry_at;
            END IF;
        ELSIF v_run.state <> 'running' THEN
            r_outcome := v_run.state;
        ELSIF v_run.token = p_token[v_run.i] THEN
            r_outcome := 'won';
            r_attempt := coalesce(v_run.attempt, 1);
            r_fence := v_run.fence;
            r_earlier := v_run.earlier::text;
        ELSIF coalesce(v_run.lease_until, v_now) >= v_now THEN
            r_outcome := 'running';
            r_lease_until := coalesce(v_run.lease_until, v_now);
        END IF;
        IF r_outcome IS NULL THEN
            v_slow[v_run.i] := true;
            v_any_slow := true;
            v_window_kept := v_window_kept AND v_run.window_kept;
        ELSE
            RETURN NEXT;
        END IF;
    END LOOP;
    IF NOT v_any_slow THEN
        RETURN;
    END IF;

    -- 1. Lock the row of every job with a claim left, in byte order of the
    -- names. Until this transaction ends, any other claim of these jobs
    -- that may write waits here; and because every caller locks in the
    -- same order, two batches that share jobs cannot deadlock.
    -- The same write records each job's longest late window.
    FOR v_job, v_window IN
        SELECT u.job COLLATE "C", max(u.max_late)
          FROM unnest(p_job, p_max_late, v_slow) AS u(job, max_late, slow)
         WHERE u.slow
         GROUP BY 1
         ORDER BY 1
    LOOP
        INSERT INTO "{{table}}_jobs" AS j (job, late_window) VALUES (v_job, v_window)
        ON CONFLICT (job) DO UPDATE
           SET late_window = greatest(j.late_window, EXCLUDED.late_window);
    END LOOP;

    -- 2. Decide each claim left, in the order given.
    FOR i IN 1 .. n LOOP
        CONTINUE WHEN NOT v_slow[i];
        v_job := p_job[i];
        v_slot := p_slot[i];
        r_idx := i;
        r_outcome := NULL;
        r_attempt := NULL;
        r_fence := NULL;
        r_lease_until := NULL;
        r_earlier := NULL;
        -- Set by the branches below that answer without writing.
        v_read_only := false;

        SELECT t.state, t.attempt, t.token, t.fence, t.lease_until, t.retry_at,
               t.finished_at, t.instance, t.error, t.earlier
          INTO v_run
          FROM "{{table}}" AS t
         WHERE t.job = v_job AND t.slot = v_slot
           FOR UPDATE;
        v_found := FOUND;

        -- The time of the decision, read after every lock was granted: now()
        -- would be the start of the transaction, before any wait.
        v_now := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
        r_store_now := v_now;
        v_until := least(v_now::numeric + p_lease[i], 9223372036854775807)::bigint;

        -- A slot nobody ran, or one recorded missed or waiting (or, for a
        -- backfill's claim, paused): steps 5 and 6 of `decide::claim`
        -- (`not_yet_run`).
        IF NOT v_found OR v_run.state IN ('missed', 'waiting')
           OR (v_run.state = 'paused' AND p_rerun_paused[i]) THEN
            v_waiting := v_found AND v_run.state = 'waiting';
            IF EXISTS (
                SELECT 1
                  FROM "{{table}}_pauses" AS p
                 WHERE p.scope IN (v_job, '*')
                   AND (p.until IS NULL OR v_now < p.until)
            ) THEN
                -- The job, or every job, is paused: a slot nobody ran, or
                -- one that was waiting, is recorded so and runs nowhere; a
                -- missed or paused one stays so.
                IF NOT v_found OR v_waiting THEN
                    INSERT INTO "{{table}}" AS t (job, slot, state, finished_at)
                    VALUES (v_job, v_slot, 'paused', v_now)
                    ON CONFLICT (job, slot) DO UPDATE
                       SET state = 'paused', attempt = NULL, token = NULL, fence = NULL,
                           instance = NULL, started_at = NULL, finished_at = EXCLUDED.finished_at,
                           lease_until = NULL, error = NULL, retry_at = NULL, earlier = NULL;
                    r_outcome := 'paused';
                ELSIF v_run.state = 'paused' THEN
                    r_outcome := 'paused';
                    v_read_only := true;
                ELSE
                    r_outcome := 'late';
                    v_read_only := true;
                END IF;
            ELSIF v_now::numeric - abs(v_slot::numeric) > p_max_late[i] THEN
                -- (A manual run's slot is its request time negated: it is
                -- late by its request time.)
                -- Too late. The first late claim of a slot nobody ran says
                -- so; a slot that waited past its max_late is missed too.
                IF NOT v_found OR v_waiting THEN
                    INSERT INTO "{{table}}" AS t (job, slot, state, finished_at)
                    VALUES (v_job, v_slot, 'missed', v_now)
                    ON CONFLICT (job, slot) DO UPDATE
                       SET state = 'missed', attempt = NULL, token = NULL, fence = NULL,
                           instance = NULL, started_at = NULL, finished_at = EXCLUDED.finished_at,
                           lease_until = NULL, error = NULL, retry_at = NULL, earlier = NULL;
                    -- This claim recorded it: the one instance told so.
                    r_outcome := 'recorded-missed';
                ELSE
                    r_outcome := 'late';
                    v_read_only := true;
                END IF;
            ELSE
                -- The overlap rule decides (v_step). With `buffer-one`, one
                -- slot of the job waits at most: while another one's wait
                -- is not over, a later slot is skipped — even once the live
                -- run has ended and the waiting slot has not started yet.
                -- (It reads the partial index of the job's waiting slots,
                -- `{{table}}_waiting`.)
                IF p_overlap[i] = 'buffer-one' AND NOT v_waiting AND EXISTS (
                    SELECT 1
                      FROM "{{table}}" AS o
                     WHERE o.job = v_job
                       AND o.state = 'waiting'
                       AND o.lease_until >= v_now
                       AND o.slot <> v_slot
                ) THEN
                    v_step := 'skip';
                ELSIF p_overlap[i] IN ('skip', 'buffer-one') AND (
                    EXISTS (
                        SELECT 1
                          FROM "{{table}}" AS o
                         WHERE o.job = v_job
                           AND o.state = 'running'
                           AND o.lease_until >= v_now
                           AND o.slot <> v_slot
                    ) OR EXISTS (
                        SELECT 1
                          FROM "{{table}}" AS o
                         WHERE o.job = v_job
                           AND o.state = 'failed'
                           AND o.retry_at >= v_now
                           AND o.slot <> v_slot
                    )
                ) THEN
                    -- Another run of the job is still going — it holds a
                    -- live lease, or it failed and its retry is not due yet
                    -- (each check reads a partial index of the job's few
                    -- live runs: `{{table}}_live`, `{{table}}_retries`).
                    -- `skip` skips the slot; `buffer-one` makes it wait, or
                    -- keeps it waiting.
                    v_step := CASE
                        WHEN p_overlap[i] = 'skip' THEN 'skip'
                        WHEN v_waiting THEN 'keep waiting'
                        ELSE 'wait'
                    END;
                ELSE
                    v_step := 'start';
                END IF;

                IF v_step = 'skip' THEN
                    -- Recorded skipped, for every instance that asks.
                    INSERT INTO "{{table}}" AS t (job, slot, state, finished_at)
                    VALUES (v_job, v_slot, 'skipped', v_now)
                    ON CONFLICT (job, slot) DO UPDATE
                       SET state = 'skipped', attempt = NULL, token = NULL, fence = NULL,
                           instance = NULL, started_at = NULL, finished_at = EXCLUDED.finished_at,
                           lease_until = NULL, error = NULL, retry_at = NULL, earlier = NULL;
                    r_outcome := 'overlap';
                ELSIF v_step IN ('wait', 'keep waiting') THEN
                    -- The slot waits, nobody's, until its slot plus its
                    -- max_late (`lease_until`); every claimant is told to
                    -- look again one lease from now, as a backup would.
                    IF v_step = 'wait' THEN
                        INSERT INTO "{{table}}" AS t (job, slot, state, lease_until)
                        VALUES (v_job, v_slot, 'waiting',
                                least(abs(v_slot::numeric) + p_max_late[i],
                                      9223372036854775807)::bigint)
                        ON CONFLICT (job, slot) DO UPDATE
                           SET state = 'waiting', attempt = NULL, token = NULL, fence = NULL,
                               instance = NULL, started_at = NULL, finished_at = NULL,
                               lease_until = EXCLUDED.lease_until, error = NULL,
                               retry_at = NULL, earlier = NULL;
                    END IF;
                    r_outcome := 'running';
                    r_lease_until := v_until;
                ELSE
                    IF p_overlap[i] = 'replace' THEN
                        -- `replace`: every other run of the job still going
                        -- ends now, replaced by this one — running (whatever
                        -- its lease), or failed and waiting for its retry.
                        -- Each keeps its holder, so its runner's next
                        -- heartbeat or finish is fenced. (Each update reads
                        -- a partial index: `{{table}}_live`,
                        -- `{{table}}_retries`.)
                        UPDATE "{{table}}" AS o
                           SET state = 'replaced', finished_at = v_now, retry_at = NULL
                         WHERE o.job = v_job
                           AND o.state = 'running'
                           AND o.slot <> v_slot;
                        UPDATE "{{table}}" AS o
                           SET state = 'replaced', finished_at = v_now, retry_at = NULL
                         WHERE o.job = v_job
                           AND o.state = 'failed'
                           AND o.retry_at IS NOT NULL
                           AND o.slot <> v_slot;
                    END IF;
                    -- Start: attempt 1 under a new fence (a waiting slot
                    -- becomes a run like any other).
                    UPDATE "{{table}}_jobs" AS j SET last_fence = j.last_fence + 1
                     WHERE j.job = v_job
                    RETURNING j.last_fence INTO v_fence;
                    INSERT INTO "{{table}}" AS t
                           (job, slot, state, attempt, token, fence, instance,
                            started_at, finished_at, lease_until, error)
                    VALUES (v_job, v_slot, 'running', 1, p_token[i], v_fence, p_instance[i],
                            v_now, NULL, v_until, NULL)
                    ON CONFLICT (job, slot) DO UPDATE
                       SET state = 'running', attempt = 1, token = EXCLUDED.token,
                           fence = EXCLUDED.fence, instance = EXCLUDED.instance,
                           started_at = EXCLUDED.started_at, finished_at = NULL,
                           lease_until = EXCLUDED.lease_until, error = NULL,
                           retry_at = NULL, earlier = NULL;
                    r_outcome := 'won';
                    r_attempt := 1;
                    r_fence := v_fence;
                END IF;
            END IF;
        ELSIF v_run.state = 'failed' AND v_run.retry_at IS NOT NULL THEN
            -- A failure whose retry is pending (step 1 of `decide::claim`).
            -- Neither late nor paused: the retry belongs to a run that
            -- started, and the runner that failed already decided that
            -- attempts were left.
            IF v_now < v_run.retry_at THEN
                -- Not due yet: the run counts as going on until then.
                r_outcome := 'running';
                r_lease_until := v_run.retry_at;
                v_read_only := true;
            ELSE
                -- Due: the next attempt, under a new fence, and the failed
                -- attempt joins the past ones.
                UPDATE "{{table}}_jobs" AS j SET last_fence = j.last_fence + 1
                 WHERE j.job = v_job
                RETURNING j.last_fence INTO v_fence;
                r_attempt := coalesce(v_run.attempt, 1) + 1;
                v_earlier := coalesce(v_run.earlier, '[]'::jsonb);
                IF v_run.attempt IS NOT NULL THEN
                    v_earlier := v_earlier || jsonb_build_array(jsonb_strip_nulls(
                        jsonb_build_object(
                            'attempt', v_run.attempt,
                            'ended', 'failed',
                            'at', v_run.finished_at,
                            'instance', v_run.instance,
                            'error', v_run.error)));
                END IF;
                UPDATE "{{table}}" AS t
                   SET state = 'running', attempt = r_attempt, token = p_token[i],
                       fence = v_fence, instance = p_instance[i], lease_until = v_until,
                       finished_at = NULL, error = NULL, retry_at = NULL,
                       earlier = v_earlier
                 WHERE t.job = v_job AND t.slot = v_slot;
                r_outcome := 'won';
                r_fence := v_fence;
                r_earlier := v_earlier::text;
            END IF;
        ELSIF v_run.state <> 'running' THEN
            -- Finished: succeeded, failed (with no retry pending),
            -- interrupted, skipped, paused or replaced.
            r_outcome := v_run.state;
            v_read_only := true;
        ELSIF v_run.token = p_token[i] THEN
            -- Our own claim, sent again.
            r_outcome := 'won';
            r_attempt := coalesce(v_run.attempt, 1);
            r_fence := v_run.fence;
            r_earlier := v_run.earlier::text;
            v_read_only := true;
        ELSIF coalesce(v_run.lease_until, v_now) >= v_now THEN
            -- Someone else's live lease.
            r_outcome := 'running';
            r_lease_until := coalesce(v_run.lease_until, v_now);
            v_read_only := true;
        ELSIF v_run.token IS NULL OR coalesce(v_run.attempt, 1) < p_max_attempts[i] THEN
            -- The lease ran out and attempts are left: take the run over.
            -- A run given back before its handler started (no holder)
            -- runs the same attempt again; otherwise the attempt whose
            -- lease ran out joins the past ones.
            UPDATE "{{table}}_jobs" AS j SET last_fence = j.last_fence + 1
             WHERE j.job = v_job
            RETURNING j.last_fence INTO v_fence;
            r_attempt := coalesce(v_run.attempt, 1)
                         + CASE WHEN v_run.token IS NULL THEN 0 ELSE 1 END;
            v_earlier := v_run.earlier;
            IF v_run.token IS NOT NULL AND v_run.attempt IS NOT NULL THEN
                v_earlier := coalesce(v_earlier, '[]'::jsonb) || jsonb_build_array(jsonb_strip_nulls(
                    jsonb_build_object(
                        'attempt', v_run.attempt,
                        'ended', 'taken-over',
                        'at', v_run.lease_until,
                        'instance', v_run.instance)));
            END IF;
            UPDATE "{{table}}" AS t
               SET attempt = r_attempt, token = p_token[i], fence = v_fence,
                   instance = p_instance[i], lease_until = v_until, earlier = v_earlier
             WHERE t.job = v_job AND t.slot = v_slot;
            r_outcome := 'won';
            r_fence := v_fence;
            r_earlier := v_earlier::text;
        ELSE
            -- The lease ran out and no attempts are left.
            UPDATE "{{table}}" AS t
               SET state = 'interrupted', finished_at = v_now
             WHERE t.job = v_job AND t.slot = v_slot;
            -- This claim ended it: the one instance told so.
            r_outcome := 'recorded-interrupted';
        END IF;

        v_all_read_only := v_all_read_only AND v_read_only;
        RETURN NEXT;
    END LOOP;

    -- 3. A transaction that changed nothing commits without waiting for its
    -- commit record to reach the disk. Such are the claims that lose a race
    -- for a fresh slot after reading it before the winner committed: each
    -- took the job's lock behind the winner only to read the winner's run,
    -- and rewrote the job's row with the late window it already held. The
    -- row locks are released only after the commit, so these flushes were
    -- paid one after the other by every instance of the race. Lost in a
    -- crash, such a transaction loses nothing: the answers it gave were read
    -- from rows that other transactions committed with a flush (every
    -- transaction that writes keeps the server's setting). Any claim that
    -- wrote, or recorded a longer late window, keeps the setting too.
    IF v_all_read_only AND v_window_kept THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
END
$claim$;
