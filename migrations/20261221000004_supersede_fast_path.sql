-- Supersession at enqueue, without a look at older rows where there can be none: a bulk
-- load into a rule with nothing pending (the initial sync) paid one index probe per key.
-- Now only the keys of rules that had a pending delivery older than the statement's rows
-- are probed as before; in the other rules only the statement's own rows can be older
-- (the same key twice in one INSERT), found among the new rows alone. The check for older
-- pending rows is one probe of `deliveries_pending` per rule of the statement.
CREATE OR REPLACE FUNCTION courier_supersede_older() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE $q$
        WITH firsts AS (
            SELECT n.rule_id, min(n.id) AS first FROM new_deliveries n GROUP BY n.rule_id),
        probed AS (
            SELECT f.rule_id FROM firsts f
            WHERE EXISTS (SELECT 1 FROM deliveries d
                          WHERE d.rule_id = f.rule_id AND d.status = 'pending'
                            AND d.id < f.first)),
        -- Rules with older pending rows: each key's deliveries, one probe per key.
        from_older AS (
            SELECT x.id
            FROM (SELECT n.rule_id, n.record_key, max(n.id) AS newest
                  FROM new_deliveries n JOIN probed p ON p.rule_id = n.rule_id
                  GROUP BY n.rule_id, n.record_key) k
            CROSS JOIN LATERAL (SELECT d.id, d.rule_id, d.status, d.superseded
                                FROM deliveries d WHERE d.record_key = k.record_key
                                OFFSET 0) x
            WHERE x.rule_id = k.rule_id AND x.id < k.newest
              AND x.status = 'pending' AND NOT x.superseded),
        -- The other rules: a key twice in this statement, the older rows among the new.
        within AS (
            SELECT t.id FROM (
                SELECT n.id, max(n.id) OVER (PARTITION BY n.rule_id, n.record_key) AS newest
                FROM new_deliveries n
                WHERE NOT EXISTS (SELECT 1 FROM probed p WHERE p.rule_id = n.rule_id)) t
            WHERE t.id < t.newest)
        UPDATE deliveries o SET superseded = true
        WHERE o.id = ANY (ARRAY(SELECT id FROM from_older UNION ALL SELECT id FROM within))
    $q$;
    RETURN NULL;
END $$;
