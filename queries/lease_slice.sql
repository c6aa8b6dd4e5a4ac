-- One statement books a budget's next slice of request slots (pacer::Pacer::lease_slice).
INSERT INTO budgets AS b (budget_key, tat, updated_at, declared_rpm, accepted,
                              accepted_since, advertised_rpm, advertised_at)
    VALUES ($1, GREATEST($2::timestamptz, $6::timestamptz)
                + courier_slice_span(least($3::int::float8, $5::float8)) * $8::float8,
            $2, $3, $4, $2, $5, CASE WHEN $5::float8 IS NOT NULL THEN $2 END)
    ON CONFLICT (budget_key) DO UPDATE SET
      tat = GREATEST(b.tat, EXCLUDED.updated_at, $6::timestamptz)
            + courier_slice_span(courier_effective_rpm(
                EXCLUDED.declared_rpm, b.learned_rpm, b.learned_at, b.ceiling_rpm,
                COALESCE(EXCLUDED.advertised_rpm, b.advertised_rpm),
                COALESCE(EXCLUDED.advertised_at, b.advertised_at), EXCLUDED.updated_at))
              * $8::float8,
      updated_at = EXCLUDED.updated_at,
      declared_rpm = EXCLUDED.declared_rpm,
      accepted = CASE WHEN b.accepted_since IS NULL OR b.tat < EXCLUDED.updated_at - $7::interval
                      THEN EXCLUDED.accepted ELSE b.accepted + EXCLUDED.accepted END,
      accepted_since = CASE WHEN b.accepted_since IS NULL OR b.tat < EXCLUDED.updated_at - $7::interval
                            THEN GREATEST(EXCLUDED.updated_at, b.learned_at)
                            ELSE b.accepted_since END,
      advertised_rpm = COALESCE(EXCLUDED.advertised_rpm, b.advertised_rpm),
      advertised_at = COALESCE(EXCLUDED.advertised_at, b.advertised_at)
    RETURNING tat AS "tat!",
              courier_effective_rpm(b.declared_rpm, b.learned_rpm, b.learned_at,
                  b.ceiling_rpm, b.advertised_rpm, b.advertised_at, b.updated_at) AS "effective!",
              courier_slice_len(courier_effective_rpm(b.declared_rpm, b.learned_rpm,
                  b.learned_at, b.ceiling_rpm, b.advertised_rpm, b.advertised_at,
                  b.updated_at)) AS "slice!"
