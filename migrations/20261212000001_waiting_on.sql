-- Pending deliveries by the key they wait for (`depends_on`): when a key is delivered, its
-- dependants are made due at once (ledger::record), found through this index rather than
-- by reading every pending delivery of the connection.
CREATE INDEX deliveries_waiting_on ON deliveries (depends_on)
    WHERE status = 'pending' AND depends_on IS NOT NULL;
