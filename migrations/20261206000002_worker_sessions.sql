-- Liveness by session as well as by beat: a worker process names its queue listener's
-- session after itself (application_name) and records the role it connected as. A process
-- killed with -9 loses that session at once (the server sees the socket close), so another
-- process may take its work over after a short grace instead of the whole beat window.
ALTER TABLE workers ADD COLUMN session_role text;

-- Whether worker `w` is alive: its beat is younger than `cutoff`; and, when it named its
-- session with the role this session has (so pg_stat_activity shows it here), that
-- session still exists or its beat is younger than `grace`. A listener reconnecting for a
-- moment does not make a beating process look dead: both must be missing.
CREATE FUNCTION courier_worker_alive(w workers, cutoff timestamptz, grace timestamptz)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT w.heartbeat_at >= cutoff AND (
        w.session_role IS DISTINCT FROM current_user
        OR w.heartbeat_at >= grace
        OR EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.application_name = w.name))
$$;
