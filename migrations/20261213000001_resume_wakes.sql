-- A rule or connection resumed (paused → not paused) or a rule enabled, by plain SQL as by
-- `courier rule resume`, wakes the dispatchers, as an insert into deliveries does: the
-- backlog goes out at once rather than at the dispatcher's next timed pass (up to
-- COURIER_DISPATCH_INTERVAL_MS). One notification per transaction (PostgreSQL folds equal
-- ones); pausing, disabling and other updates send none.
CREATE TRIGGER rules_resumed AFTER UPDATE OF paused, enabled ON rules
    FOR EACH ROW WHEN ((OLD.paused AND NOT NEW.paused) OR (NOT OLD.enabled AND NEW.enabled))
    EXECUTE FUNCTION courier_notify_deliveries();
CREATE TRIGGER connections_resumed AFTER UPDATE OF paused ON connections
    FOR EACH ROW WHEN (OLD.paused AND NOT NEW.paused)
    EXECUTE FUNCTION courier_notify_deliveries();
