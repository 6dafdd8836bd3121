#!/usr/bin/env bash
# Makes sure a MariaDB answers on 127.0.0.1:3306 as root with an empty
# password. On a fresh Debian machine (as root) it installs mariadb-server,
# starts it (with a row-based binary log) and opens root to TCP logins.
set -euo pipefail

ping_tcp() { mariadb -h127.0.0.1 -P3306 -uroot -e 'SELECT 1' >/dev/null 2>&1; }

if command -v mariadb >/dev/null 2>&1 && ping_tcp; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "ensure-mariadb: no MariaDB answers on 127.0.0.1:3306 and I am not root to install one" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# The MariaDB this script installs or starts writes a row-based binary log
# (kept 3 days), which rgproxy reads for the bytes a write wrote
# (--write-source). One that already runs is left as it is.
binlog=(--log-bin=mariadb-bin --binlog-format=ROW --server-id=1 --binlog-expire-logs-seconds=259200)
if ! command -v mariadbd >/dev/null 2>&1 && [ ! -x /usr/sbin/mariadbd ]; then
  echo "ensure-mariadb: installing mariadb-server (with a row-based binary log)"
  mkdir -p /etc/mysql/mariadb.conf.d
  cat >/etc/mysql/mariadb.conf.d/60-rgproxy-binlog.cnf <<'CNF'
# Written by rgproxy's scripts/ensure-mariadb.sh: rgproxy reads the
# row-based binary log for the bytes a statement wrote (--write-source).
[mariadbd]
log_bin = mariadb-bin
binlog_format = ROW
server_id = 1
binlog_expire_logs_seconds = 259200
CNF
  apt-get update -qq
  apt-get install -y -qq mariadb-server mariadb-client >/dev/null
fi
mkdir -p /run/mysqld
chown mysql:mysql /run/mysqld
if [ ! -d /var/lib/mysql/mysql ]; then
  mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
fi
if ! pgrep -x mariadbd >/dev/null 2>&1; then
  echo "ensure-mariadb: starting mariadbd"
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql "${binlog[@]}"
fi
for _ in $(seq 1 60); do
  if mariadb -uroot -e 'SELECT 1' >/dev/null 2>&1 || ping_tcp; then break; fi
  sleep 1
done
# root may log in only through the unix socket on a fresh install: open TCP.
if ! ping_tcp; then
  mariadb -uroot -e "ALTER USER root@localhost IDENTIFIED VIA mysql_native_password USING PASSWORD('') OR unix_socket; FLUSH PRIVILEGES;"
fi
# Anonymous users shadow 'app'@'%' style test users.
mariadb -h127.0.0.1 -uroot -e "DROP USER IF EXISTS ''@'localhost'; DROP USER IF EXISTS ''@'$(hostname)'; CREATE DATABASE IF NOT EXISTS test;"
ping_tcp || { echo "ensure-mariadb: MariaDB still not reachable on 127.0.0.1:3306" >&2; exit 1; }
echo "ensure-mariadb: MariaDB is up on 127.0.0.1:3306"
