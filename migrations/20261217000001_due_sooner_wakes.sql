-- A pending delivery made due sooner (say, `UPDATE deliveries SET next_attempt_at = now()`
-- by hand, or courier releasing the deliveries held for a record just delivered) wakes
-- the dispatchers, which then start its rule's run or set their timer to the new time,
-- instead of finding it at their next timed pass (up to COURIER_DISPATCH_INTERVAL_MS).
-- As with `deliveries_pending_again`, the condition is evaluated per row without calling
-- the function: courier's own updates move pending deliveries later (a backoff) or end
-- them, and notify no one. The notification says why (`due sooner`): the function sends
-- its trigger's argument, when it has one.
CREATE OR REPLACE FUNCTION courier_notify_deliveries() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('courier_deliveries', coalesce(TG_ARGV[0], ''));
    RETURN NULL;
END $$;
CREATE TRIGGER deliveries_due_sooner AFTER UPDATE OF next_attempt_at ON deliveries
    FOR EACH ROW
    WHEN (OLD.status = 'pending' AND NEW.status = 'pending'
          AND NEW.next_attempt_at < OLD.next_attempt_at)
    EXECUTE FUNCTION courier_notify_deliveries('due sooner');
