-- The User.com writer: connections may name it.
ALTER TABLE connections DROP CONSTRAINT connections_writer_check;
ALTER TABLE connections ADD CONSTRAINT connections_writer_check
    CHECK (writer IN ('http_json', 'usercom'));
