package main

import (
	"context"
	"crypto/tls"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// serviceConn is rgproxy's one credential (docs/design.md): a connection as
// --admin-user for what a session's own backend connection cannot do while
// it is busy — KILL QUERY of a runaway statement. (The same account reads
// the binary log, on a connection of internal/binlog's own.) It is safe for
// concurrent use; database/sql keeps at most one connection open and
// redials it when the backend dropped it.
//
// go-sql-driver/mysql rather than go-mysql's client: the latter imports
// TiDB's parser module, which rgproxy's binary does not otherwise need.
type serviceConn struct {
	db   *sql.DB
	user string
}

// readAdminPassword reads --admin-password-file.
func readAdminPassword(passwordFile string) (string, error) {
	pw, err := os.ReadFile(passwordFile)
	if err != nil {
		return "", fmt.Errorf("--admin-password-file: %w", err)
	}
	return strings.TrimRight(string(pw), "\r\n"), nil
}

// newServiceConn prepares (without dialing) the service connection.
func newServiceConn(backend, user, password string, backendTLS *tls.Config, dialTimeout time.Duration) (*serviceConn, error) {
	cfg := mysql.NewConfig()
	cfg.User = user
	cfg.Passwd = password
	cfg.Net = "tcp"
	cfg.Addr = backend
	cfg.Timeout = dialTimeout
	cfg.AllowNativePasswords = true
	if backendTLS != nil {
		cfg.TLS = backendTLS.Clone()
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("service connection: %w", err)
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxIdleTime(5 * time.Minute)
	return &serviceConn{db: db, user: user}, nil
}

// KillQuery interrupts the statement running on backend connection id.
func (s *serviceConn) KillQuery(ctx context.Context, id uint32) error {
	// An id is a number: no quoting to get wrong.
	if _, err := s.db.ExecContext(ctx, fmt.Sprintf("KILL QUERY %d", id)); err != nil {
		return fmt.Errorf("KILL QUERY %d as %s: %w", id, s.user, err)
	}
	return nil
}

// RolesHoldAdmin reports whether any of roles holds SUPER (MariaDB's
// mysql.user view lists roles with is_role = 'Y' and their global
// privileges as Y/N columns). The names are bound parameters of a
// server-side prepared statement: data, never SQL text. An account
// without SELECT on mysql.user gets an error, and roles then count only
// through the role rgproxy_admin.
func (s *serviceConn) RolesHoldAdmin(ctx context.Context, roles []string) (bool, error) {
	for _, r := range roles {
		var n int
		err := s.db.QueryRowContext(ctx,
			"SELECT COUNT(*) FROM mysql.user WHERE User = ? AND Host = '' AND is_role = 'Y' AND Super_priv = 'Y'", r).Scan(&n)
		if err != nil {
			return false, fmt.Errorf("reading role privileges as %s: %w", s.user, err)
		}
		if n > 0 {
			return true, nil
		}
	}
	return false, nil
}

// Ping checks the account at start, so a wrong password shows at once.
func (s *serviceConn) Ping(ctx context.Context) error {
	if err := s.db.PingContext(ctx); err != nil {
		return fmt.Errorf("service connection as %s: %w", s.user, err)
	}
	return nil
}

func (s *serviceConn) Close() error { return s.db.Close() }
