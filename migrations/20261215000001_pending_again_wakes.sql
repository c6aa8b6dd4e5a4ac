-- A delivery made pending again (a retry), by plain SQL as by `courier retry`, wakes the
-- dispatchers, as an insert into deliveries does: it goes out at once rather than at the
-- dispatcher's next timed pass (up to COURIER_DISPATCH_INTERVAL_MS). The condition is
-- evaluated per row without calling the function, so courier's own outcome updates (from
-- pending to another status, or pending again later) cost no call and notify no one; a
-- retry of many rows sends one notification per transaction (PostgreSQL folds equal ones).
CREATE TRIGGER deliveries_pending_again AFTER UPDATE OF status ON deliveries
    FOR EACH ROW WHEN (OLD.status <> 'pending' AND NEW.status = 'pending')
    EXECUTE FUNCTION courier_notify_deliveries();
