-- A delivery the target took without ever reporting its fate (a job with nothing to poll,
-- such as Klaviyo's bulk subscribe): `unconfirmed`, final, never read as delivered.
ALTER TABLE deliveries DROP CONSTRAINT deliveries_status_check;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_status_check CHECK (status IN
    ('pending', 'accepted', 'delivered', 'unconfirmed', 'rejected', 'exhausted', 'suppressed'));

ALTER TABLE ledger DROP CONSTRAINT ledger_outcome_check;
ALTER TABLE ledger ADD CONSTRAINT ledger_outcome_check CHECK (outcome IN
    ('delivered', 'accepted', 'unconfirmed', 'failed', 'exhausted', 'rejected', 'suppressed',
     'held', 'retried'));

-- Retention prunes unconfirmed deliveries as it prunes delivered ones.
DROP INDEX deliveries_finished;
CREATE INDEX deliveries_finished ON deliveries (finished_at)
    WHERE status IN ('delivered', 'unconfirmed', 'suppressed');
