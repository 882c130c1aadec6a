-- What isolates each session's harness (`bubblewrap`, `none`, `pod`), shown on the session.
-- `tty_token` now holds `sha256:<hex>` of the terminal token, never the token (lap-server
-- rehashes rows written before this migration at start).
ALTER TABLE sessions ADD COLUMN isolation TEXT;
