-- Where each worker process serves its metrics and dashboard (`host:port`; NULL: it
-- serves none). Several workers on one host each take a port of their own, so the
-- operator (and Prometheus) finds them in `courier status`, which lists the live ones.
ALTER TABLE workers ADD COLUMN http_addr text;
