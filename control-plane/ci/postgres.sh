# Source this (bash): starts a throwaway PostgreSQL for lap-control-plane's Postgres tests and
# exports LAP_TEST_DATABASE_URL. Needs Debian's `postgresql` package (initdb/pg_ctl under
# /usr/lib/postgresql/<version>/bin). As root it runs the server as the `postgres` user.
#
#   . control-plane/ci/postgres.sh && cargo nextest run -p lap-control-plane
#
# `lap_pg_stop` stops the server and removes its data (`trap lap_pg_stop EXIT` in a script).
lap_pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$lap_pg_bin" ] || [ ! -x "$lap_pg_bin/initdb" ]; then
  echo "control-plane/ci/postgres.sh: PostgreSQL is not installed (apt-get install postgresql)" >&2
  return 1 2>/dev/null || exit 1
fi
# A free loopback port unless LAP_TEST_PG_PORT says which.
lap_pg_port=${LAP_TEST_PG_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
lap_pg_dir=$(mktemp -d /tmp/lap-pg.XXXXXX)
chmod 0755 "$lap_pg_dir"
if [ "$(id -u)" = 0 ]; then
  chown postgres "$lap_pg_dir"
  lap_pg_run() { su postgres -s /bin/sh -c "$*"; }
else
  lap_pg_run() { sh -c "$*"; }
fi
if ! lap_pg_run "'$lap_pg_bin/initdb' -D '$lap_pg_dir/data' -A trust -U postgres" >/dev/null \
  || ! lap_pg_run "'$lap_pg_bin/pg_ctl' -D '$lap_pg_dir/data' -l '$lap_pg_dir/log' -w \
       -o \"-p $lap_pg_port -k $lap_pg_dir -c listen_addresses=127.0.0.1\" start" >/dev/null \
  || ! lap_pg_run "'$lap_pg_bin/createdb' -h 127.0.0.1 -p $lap_pg_port -U postgres lap_test"; then
  echo "control-plane/ci/postgres.sh: could not start PostgreSQL on port $lap_pg_port:" >&2
  cat "$lap_pg_dir/log" >&2 2>/dev/null
  return 1 2>/dev/null || exit 1
fi
export LAP_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$lap_pg_port/lap_test"
echo "postgres for tests: $LAP_TEST_DATABASE_URL (data in $lap_pg_dir/data)"
lap_pg_stop() {
  lap_pg_run "'$lap_pg_bin/pg_ctl' -D '$lap_pg_dir/data' -m fast stop" >/dev/null 2>&1 || true
  rm -rf "$lap_pg_dir"
}
