-- How a budget's learned rate was set by its last 429 (issue #9; learned::Lesson): a
-- token bucket declared too high lets the excess through until its burst is spent, so its
-- 429s come at about the pace; what it let through between two refusals is its rate, and
-- the next 429 needs to know that the rate it cuts came from there.
ALTER TABLE budgets
    ADD COLUMN learned_by text CHECK (learned_by IN ('lone', 'halved', 'measured', 'between',
                                                     'bucket', 'probe', 'slow_probe', 'streak',
                                                     'sporadic'));

CREATE OR REPLACE VIEW budget_rates AS
SELECT b.budget_key, b.declared_rpm,
       courier_learned_rpm(b.learned_rpm, b.learned_at, b.ceiling_rpm, b.declared_rpm, now())
           AS learned_rpm,
       courier_advertised_rpm(b.advertised_rpm, b.advertised_at, now()) AS advertised_rpm,
       courier_effective_rpm(b.declared_rpm, b.learned_rpm, b.learned_at, b.ceiling_rpm,
                             b.advertised_rpm, b.advertised_at, now()) AS effective_rpm,
       b.learned_at, b.last_429_at, b.ceiling_rpm, b.learned_by
FROM budgets b
WHERE b.declared_rpm IS NOT NULL;
