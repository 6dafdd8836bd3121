package mysqlproto

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"database/sql"
	"errors"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	sqldriver "github.com/go-sql-driver/mysql"
)

// selfSigned makes a TLS certificate for 127.0.0.1.
func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "rgproxy test"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// scriptBackend is a minimal MySQL server with a scripted authentication,
// for what the shared MariaDB cannot show: a TLS backend leg, clear-text
// plugins, the PROXY header. It answers every COM_QUERY with an OK.
type scriptBackend struct {
	t      *testing.T
	ln     net.Listener
	cert   tls.Certificate
	plugin string // plugin named in the greeting
	// auth runs after the handshake response; it returns false to refuse.
	auth func(b *scriptConn, resp handshakeResponse) bool
	seen chan scriptSeen
	// proxyProto: expect a PROXY header first.
	proxyProto bool
}

// scriptSeen is what the backend observed of one connection.
type scriptSeen struct {
	proxyLine string
	tls       bool
	caps      uint32
	filler    []byte
	user      string
	authData  [][]byte // every auth packet the client sent after the response
}

type scriptConn struct {
	br   *bufio.Reader
	bw   *bufio.Writer
	seq  byte
	seen *scriptSeen
}

func (c *scriptConn) send(p []byte) {
	c.seq++
	writeMessage(c.bw, c.seq, p)
	c.bw.Flush()
}

func (c *scriptConn) recv() ([]byte, bool) {
	p, seq, err := readMessage(c.br, nil, 1<<20)
	if err != nil {
		return nil, false
	}
	c.seq = seq
	c.seen.authData = append(c.seen.authData, bytes.Clone(p))
	return p, true
}

func newScriptBackend(t *testing.T, plugin string, auth func(*scriptConn, handshakeResponse) bool, proxyProto bool) *scriptBackend {
	b := &scriptBackend{t: t, cert: selfSigned(t), plugin: plugin, auth: auth, seen: make(chan scriptSeen, 4), proxyProto: proxyProto}
	b.ln = serveTCP(t, func(c net.Conn) { go b.serve(c) })
	return b
}

func (b *scriptBackend) serve(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	var seen scriptSeen
	defer func() { b.seen <- seen }()
	br := bufio.NewReader(c)
	if b.proxyProto {
		line, _ := br.ReadString('\n')
		seen.proxyLine = line
	}
	sc := &scriptConn{br: br, bw: bufio.NewWriter(c), seq: 255, seen: &seen}
	caps := supportedCaps | mysql.CLIENT_SSL | mysql.CLIENT_COMPRESS | mysql.CLIENT_DEPRECATE_EOF
	sc.send(mariaGreeting(caps, 0x1f, b.plugin))
	p, seq, err := readMessage(br, nil, 1<<20)
	if err != nil {
		return
	}
	if len(p) == sslRequestLen {
		tc := tls.Server(&bufferedConn{c, br}, &tls.Config{Certificates: []tls.Certificate{b.cert}})
		if tc.Handshake() != nil {
			return
		}
		seen.tls = true
		sc.br, sc.bw = bufio.NewReader(tc), bufio.NewWriter(tc)
		if p, seq, err = readMessage(sc.br, nil, 1<<20); err != nil {
			return
		}
	}
	sc.seq = seq
	resp, err := parseHandshakeResponse(p)
	if err != nil {
		return
	}
	seen.caps, seen.user, seen.filler = resp.Caps, resp.User, bytes.Clone(p[9:32])
	if !b.auth(sc, resp) {
		sc.send(appendErr(nil, &Error{Code: 1045, State: "28000", Message: "Access denied for user"}))
		return
	}
	sc.send(okPkt(0, mysql.SERVER_STATUS_AUTOCOMMIT))
	for {
		p, _, err := readMessage(sc.br, nil, 1<<20)
		if err != nil || len(p) == 0 || p[0] == mysql.COM_QUIT {
			return
		}
		sc.seq = 0
		sc.send(appendOK(nil, mysql.OK_HEADER, 0, mysql.SERVER_STATUS_AUTOCOMMIT, "", 0))
	}
}

// switchTo asks the client to switch plugins and returns its answer.
func (c *scriptConn) switchTo(plugin string, data []byte) ([]byte, bool) {
	c.send(append(append([]byte{mysql.EOF_HEADER}, plugin+"\x00"...), data...))
	return c.recv()
}

func tlsDSN(t *testing.T, addr, user, pw, tlsName string) string {
	c := sqldriver.NewConfig()
	c.User, c.Passwd, c.Net, c.Addr, c.TLSConfig = user, pw, "tcp", addr, tlsName
	c.AllowNativePasswords, c.AllowCleartextPasswords = true, true
	c.Timeout = 5 * time.Second
	return c.FormatDSN()
}

func registerInsecureTLS(t *testing.T) string {
	name := "rgproxy-test-" + t.Name()
	if err := sqldriver.RegisterTLSConfig(name, &tls.Config{InsecureSkipVerify: true}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sqldriver.DeregisterTLSConfig(name) })
	return name
}

func TestClientTLSToMariaDB(t *testing.T) {
	setupSchema(t)
	cert := selfSigned(t)
	_, addr := startProxy(t, Config{ClientTLS: &tls.Config{Certificates: []tls.Certificate{cert}}, RequireTLS: true})
	name := registerInsecureTLS(t)
	db, err := sql.Open("mysql", tlsDSN(t, addr, "rgp_user", "secret1", name))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var u string
	if err := db.QueryRow("SELECT CURRENT_USER()").Scan(&u); err != nil || u != "rgp_user@%" {
		t.Fatalf("over TLS: %q %v", u, err)
	}
	plain, _ := sql.Open("mysql", tlsDSN(t, addr, "rgp_user", "secret1", "false"))
	defer plain.Close()
	err = plain.Ping()
	var me *sqldriver.MySQLError
	if !errors.As(err, &me) || me.Number != errCodeSecureTransport {
		t.Fatalf("plaintext client with RequireTLS: %v", err)
	}
}

// nativeCheck accepts the native password "pw", after switching the
// client to a fresh salt (so the relay must translate sequence ids).
func nativeCheck(c *scriptConn, resp handshakeResponse) bool {
	salt := []byte("ABCDEFGHIJKLMNOPQRST")
	ans, ok := c.switchTo("mysql_native_password", append(salt, 0))
	return ok && bytes.Equal(ans, nativePassword(salt, "pw"))
}

func TestTLSBothLegsAndAuthSwitch(t *testing.T) {
	be := newScriptBackend(t, "mysql_native_password", nativeCheck, true)
	cert := selfSigned(t)
	tests := []struct {
		name       string
		clientTLS  bool
		backendTLS bool
	}{
		{"plain", false, false},
		{"client TLS", true, false},
		{"backend TLS", false, true},
		{"both", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{BackendAddr: be.ln.Addr().String(), BackendProxyProtocol: true}
			if tt.clientTLS {
				cfg.ClientTLS = &tls.Config{Certificates: []tls.Certificate{cert}}
			}
			if tt.backendTLS {
				cfg.BackendTLS = &tls.Config{InsecureSkipVerify: true}
			}
			_, addr := startProxy(t, cfg)
			tlsName := "false"
			if tt.clientTLS {
				tlsName = registerInsecureTLS(t)
			}
			db, _ := sql.Open("mysql", tlsDSN(t, addr, "app", "pw", tlsName))
			defer db.Close()
			db.SetMaxIdleConns(0)
			if _, err := db.Exec("DO 1"); err != nil {
				t.Fatal(err)
			}
			db.Close()
			seen := <-be.seen
			if seen.tls != tt.backendTLS || seen.user != "app" {
				t.Errorf("backend saw tls=%v user=%q", seen.tls, seen.user)
			}
			if seen.caps&^supportedCaps&^mysql.CLIENT_SSL != 0 || (seen.caps&mysql.CLIENT_SSL != 0) != tt.backendTLS {
				t.Errorf("backend got capabilities %#x", seen.caps)
			}
			if !bytes.Equal(seen.filler, make([]byte, 23)) {
				t.Errorf("extended client capabilities reached the backend: %x", seen.filler)
			}
			if !strings.HasPrefix(seen.proxyLine, "PROXY TCP4 127.0.0.1 127.0.0.1 ") || !strings.HasSuffix(seen.proxyLine, "\r\n") {
				t.Errorf("PROXY header %q", seen.proxyLine)
			}
		})
	}
}

func TestClearTextPluginNeedsTLS(t *testing.T) {
	clearAuth := func(c *scriptConn, resp handshakeResponse) bool {
		ans, ok := c.switchTo("mysql_clear_password", nil)
		return ok && string(ans) == "pw\x00"
	}
	fullAuth := func(c *scriptConn, resp handshakeResponse) bool {
		c.send([]byte{mysql.MORE_DATE_HEADER, 4}) // caching_sha2: perform full authentication
		ans, ok := c.recv()
		return ok && string(ans) == "pw\x00"
	}
	cert := selfSigned(t)
	tests := []struct {
		name       string
		plugin     string
		auth       func(*scriptConn, handshakeResponse) bool
		clientTLS  bool
		backendTLS bool
		allowed    bool
	}{
		{"clear, no TLS", "mysql_native_password", clearAuth, false, false, false},
		{"clear, client TLS only", "mysql_native_password", clearAuth, true, false, false},
		{"clear, backend TLS only", "mysql_native_password", clearAuth, false, true, false},
		{"clear, both TLS", "mysql_native_password", clearAuth, true, true, true},
		{"sha2 full auth, client TLS only", "caching_sha2_password", fullAuth, true, false, false},
		{"sha2 full auth, both TLS", "caching_sha2_password", fullAuth, true, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			be := newScriptBackend(t, tt.plugin, tt.auth, false)
			cfg := Config{BackendAddr: be.ln.Addr().String()}
			if tt.clientTLS {
				cfg.ClientTLS = &tls.Config{Certificates: []tls.Certificate{cert}}
			}
			if tt.backendTLS {
				cfg.BackendTLS = &tls.Config{InsecureSkipVerify: true}
			}
			_, addr := startProxy(t, cfg)
			tlsName := "false"
			if tt.clientTLS {
				tlsName = registerInsecureTLS(t)
			}
			db, _ := sql.Open("mysql", tlsDSN(t, addr, "app", "pw", tlsName))
			defer db.Close()
			err := db.PingContext(context.Background())
			db.Close()
			seen := <-be.seen
			leaked := false
			for _, a := range seen.authData {
				leaked = leaked || bytes.Contains(a, []byte("pw\x00"))
			}
			if tt.allowed {
				if err != nil || !leaked {
					t.Fatalf("login over TLS failed: %v (password relayed: %v)", err, leaked)
				}
				return
			}
			var me *sqldriver.MySQLError
			if !errors.As(err, &me) || me.Number != mysql.ER_NOT_SUPPORTED_AUTH_MODE || !strings.Contains(me.Message, "clear text") {
				t.Fatalf("got %v, want 1251", err)
			}
			if leaked {
				t.Fatal("the password reached the backend")
			}
		})
	}
}
