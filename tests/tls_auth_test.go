package tests

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"database/sql"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// testPKI is a throw-away CA with one server certificate for 127.0.0.1.
type testPKI struct {
	CAFile, CertFile, KeyFile string
	Pool                      *x509.CertPool
}

func newTestPKI(t testing.TB) testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rgproxy test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	p := testPKI{CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem")}
	os.WriteFile(p.CAFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600)
	os.WriteFile(p.CertFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(p.KeyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
	p.Pool = x509.NewCertPool()
	p.Pool.AddCert(ca)
	return p
}

func queryString(t testing.TB, db *sql.DB, q string) string {
	t.Helper()
	var s sql.NullString
	if err := db.QueryRow(q).Scan(&s); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return s.String
}

// TestTLSBothLegsAndClearTextPlugins runs a TLS-enabled mariadbd of its own.
func TestTLSBothLegsAndClearTextPlugins(t *testing.T) {
	pki := newTestPKI(t)
	db := startPrivateMariaDB(t, "--ssl-ca="+pki.CAFile, "--ssl-cert="+pki.CertFile, "--ssl-key="+pki.KeyFile,
		"--plugin-maturity=unknown", "--plugin-load-add=auth_test_plugin")
	db.exec(t,
		"CREATE USER 'ct'@'%' IDENTIFIED VIA cleartext_plugin_server AS 'ctpass'",
		"GRANT ALL ON *.* TO 'ct'@'%'")
	if err := mysql.RegisterTLSConfig("rgtest", &tls.Config{RootCAs: pki.Pool, ServerName: "127.0.0.1"}); err != nil {
		t.Fatal(err)
	}

	// Both legs TLS, the backend's certificate verified against our CA.
	px := startProxy(t, "--backend", db.Addr, "--backend-tls", "verify", "--backend-tls-ca", pki.CAFile,
		"--tls-cert", pki.CertFile, "--tls-key", pki.KeyFile, "--require-tls")
	tlsDB := openDB(t, px.Addr, "tls=rgtest", "db=mysql")
	if c := queryString(t, tlsDB, "SELECT VARIABLE_VALUE FROM information_schema.SESSION_STATUS WHERE VARIABLE_NAME = 'Ssl_cipher'"); c == "" {
		t.Fatal("the backend leg is not TLS")
	}
	// --require-tls refuses plaintext clients with a clear error.
	plain, _ := sql.Open("mysql", dsn(px.Addr, "db=mysql"))
	defer plain.Close()
	if err := plain.Ping(); err == nil || !strings.Contains(strings.ToLower(err.Error()), "tls") {
		t.Fatalf("plaintext client with --require-tls: %v", err)
	}
	// A clear-text plugin works when both legs are TLS...
	ct := openDB(t, px.Addr, "tls=rgtest", "db=mysql", "user=ct", "password=ctpass", "allowCleartextPasswords=true")
	if u := queryString(t, ct, "SELECT CURRENT_USER()"); !strings.HasPrefix(u, "ct@") {
		t.Fatalf("clear-text login through TLS: current user %q", u)
	}

	// ...and is refused, before the password leaves the client, on a
	// proxy whose backend leg is plaintext or whose client leg is.
	for _, tc := range []struct {
		name string
		args []string
		tls  bool
	}{
		{"backend leg plaintext", []string{"--tls-cert", pki.CertFile, "--tls-key", pki.KeyFile}, true},
		{"client leg plaintext", []string{"--backend-tls", "skip-verify"}, false},
	} {
		p := startProxy(t, append([]string{"--backend", db.Addr}, tc.args...)...)
		params := []string{"db=mysql", "user=ct", "password=ctpass", "allowCleartextPasswords=true"}
		if tc.tls {
			params = append(params, "tls=rgtest")
		}
		c, _ := sql.Open("mysql", dsn(p.Addr, params...))
		err := c.Ping()
		c.Close()
		if err == nil || !strings.Contains(err.Error(), "clear") || !strings.Contains(err.Error(), "TLS") {
			t.Fatalf("%s: a clear-text plugin must be refused with a clear error, got %v", tc.name, err)
		}
		if strings.Contains(p.log.String(), "ctpass") {
			t.Fatalf("%s: the password reached rgproxy's log", tc.name)
		}
	}
}

func TestEd25519ThroughAuthSwitch(t *testing.T) {
	db := startPrivateMariaDB(t, "--plugin-load-add=auth_ed25519")
	db.exec(t,
		"CREATE USER 'ed'@'%' IDENTIFIED VIA ed25519 USING PASSWORD('edpass')",
		"GRANT SELECT ON *.* TO 'ed'@'%'")
	px := startProxy(t, "--backend", db.Addr)
	c := openDB(t, px.Addr, "db=mysql", "user=ed", "password=edpass")
	if u := queryString(t, c, "SELECT CURRENT_USER()"); !strings.HasPrefix(u, "ed@") {
		t.Fatalf("ed25519 login: current user %q", u)
	}
	bad, _ := sql.Open("mysql", dsn(px.Addr, "db=mysql", "user=ed", "password=nope"))
	defer bad.Close()
	if err := bad.Ping(); mysqlErrNo(err) != 1045 {
		t.Fatalf("wrong ed25519 password: want 1045, got %v", err)
	}
}

func TestBackendSeesClientAddressThroughProxyProtocol(t *testing.T) {
	// skip-name-resolve: the processlist then shows addresses, not "localhost".
	db := startPrivateMariaDB(t, "--skip-name-resolve")
	px := startProxy(t, "--backend", db.Addr, "--backend-proxy-protocol")
	// MariaDB accepts PROXY headers only from the networks listed here.
	db.exec(t, "SET GLOBAL proxy_protocol_networks = '127.0.0.1/32'")

	var mu sync.Mutex
	var local string
	mysql.RegisterDialContext("rgcapture", func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err == nil {
			mu.Lock()
			local = c.LocalAddr().String()
			mu.Unlock()
		}
		return c, err
	})
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.DBName = "root", "rgcapture", px.Addr, "mysql"
	c, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetMaxOpenConns(1)
	host := queryString(t, c, "SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID()")
	mu.Lock()
	defer mu.Unlock()
	if host != local {
		t.Fatalf("backend sees the session from %q; the client is at %q", host, local)
	}
}
