#!/usr/bin/env bash
# service-account.sh USER PASSWORD_FILE: creates, or brings up to date,
# rgproxy's service account USER (its --admin-user) on the MariaDB at
# 127.0.0.1:3306, logging in as root with no password (what
# scripts/ensure-mariadb.sh leaves). The password is PASSWORD_FILE's first
# line; the file is made (random, readable by its owner only) when absent,
# and the account's password is set to it every time, so the two agree.
#
# The grants are what rgproxy uses the account for (docs/operating.md,
# "rgproxy's service account"): CONNECTION ADMIN to KILL QUERY a runaway
# statement (QUERY_LIMIT ... ACTION = KILL), REPLICATION SLAVE to read the
# row-based binary log for --write-source, SELECT on mysql.user to read
# the privileges of a session's enabled roles. The account exists for
# 'localhost' and '127.0.0.1', the names a connection rgproxy makes to
# 127.0.0.1 is known by.
set -euo pipefail
user=${1:?usage: service-account.sh USER PASSWORD_FILE}
file=${2:?usage: service-account.sh USER PASSWORD_FILE}
case $user in *[!A-Za-z0-9_]*)
  echo "service-account: the user name may hold only letters, digits and _: $user" >&2
  exit 1
  ;;
esac
if [ ! -s "$file" ]; then
  (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$file" && echo >>"$file")
fi
pw=$(head -n 1 "$file")
case $pw in *[!A-Za-z0-9_]*)
  echo "service-account: $file must hold letters, digits and _ only (it is made random when absent)" >&2
  exit 1
  ;;
esac
sql=""
for host in localhost 127.0.0.1; do
  sql+="CREATE USER IF NOT EXISTS '$user'@'$host' IDENTIFIED BY '$pw';"
  sql+="ALTER USER '$user'@'$host' IDENTIFIED BY '$pw';"
  sql+="GRANT CONNECTION ADMIN, REPLICATION SLAVE ON *.* TO '$user'@'$host';"
  sql+="GRANT SELECT ON mysql.user TO '$user'@'$host';"
done
mariadb -h127.0.0.1 -P3306 -uroot -e "$sql"
