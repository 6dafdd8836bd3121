package mysqlproto

import (
	"bytes"
	"context"
	"crypto/tls"
	"database/sql"
	"errors"
	"sync"
	"testing"

	sqldriver "github.com/go-sql-driver/mysql"
)

// acceptAll lets every login in.
func acceptAll(*scriptConn, handshakeResponse) bool { return true }

// reloadBackend is a scripted backend whose per-connection reports are
// drained, for tests that open many sessions.
func reloadBackend(t *testing.T) *scriptBackend {
	be := newScriptBackend(t, "mysql_native_password", acceptAll, false)
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	go func() {
		for {
			select {
			case <-be.seen:
			case <-done:
				return
			}
		}
	}()
	return be
}

// pingNew opens a fresh session and returns its login's error.
func pingNew(t *testing.T, addr, tlsName string) error {
	t.Helper()
	db, err := sql.Open("mysql", tlsDSN(t, addr, "app", "pw", tlsName))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	return db.Ping()
}

// holdSession opens a session that stays open until the test ends.
func holdSession(t *testing.T, addr, tlsName string) *sql.Conn {
	t.Helper()
	db, err := sql.Open("mysql", tlsDSN(t, addr, "app", "pw", tlsName))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	c, err := db.Conn(context.Background())
	if err != nil {
		t.Fatalf("session: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func errNo(err error) uint16 {
	var me *sqldriver.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

func TestSetMaxConnectionsWhileServing(t *testing.T) {
	be := reloadBackend(t)
	s, addr := startProxy(t, Config{BackendAddr: be.ln.Addr().String(), MaxConnections: 1})
	first := holdSession(t, addr, "false")
	if err := pingNew(t, addr, "false"); errNo(err) != 1040 {
		t.Fatalf("second session at limit 1: want 1040, got %v", err)
	}

	if err := s.SetMaxConnections(2); err != nil || s.MaxConnections() != 2 {
		t.Fatalf("SetMaxConnections(2): %v, in force %d", err, s.MaxConnections())
	}
	second := holdSession(t, addr, "false")
	if err := pingNew(t, addr, "false"); errNo(err) != 1040 {
		t.Fatalf("third session at limit 2: want 1040, got %v", err)
	}

	// Lowering the limit closes nobody; it refuses newcomers.
	if err := s.SetMaxConnections(1); err != nil {
		t.Fatal(err)
	}
	for i, c := range []*sql.Conn{first, second} {
		if err := c.PingContext(context.Background()); err != nil {
			t.Fatalf("session %d hurt by a lower limit: %v", i+1, err)
		}
	}
	if err := pingNew(t, addr, "false"); errNo(err) != 1040 {
		t.Fatalf("new session over the lowered limit: want 1040, got %v", err)
	}

	// 0 is the default again: derived from the descriptor limit.
	if err := s.SetMaxConnections(0); err != nil {
		t.Fatal(err)
	}
	derived := s.MaxConnections()
	if nofile, ok := nofileLimit(); ok && derived != DefaultMaxConnections(nofile) {
		t.Fatalf("SetMaxConnections(0): %d in force, want %d for %d descriptors", derived, DefaultMaxConnections(nofile), nofile)
	}
	if err := pingNew(t, addr, "false"); err != nil {
		t.Fatalf("derived limit: %v", err)
	}
	if err := s.SetMaxConnections(-1); err == nil || s.MaxConnections() != derived {
		t.Fatalf("a negative limit must be refused and change nothing: %v, in force %d", err, s.MaxConnections())
	}
}

// certRecorder registers a go-sql-driver TLS config that records the
// leaf certificate of every handshake.
type certRecorder struct {
	mu      sync.Mutex
	leaves  [][]byte
	resumed []bool
}

func (r *certRecorder) register(t *testing.T) string {
	name := "rgproxy-reload-" + t.Name()
	err := sqldriver.RegisterTLSConfig(name, &tls.Config{
		InsecureSkipVerify: true,
		// Clients that resume sessions must see a new certificate too.
		ClientSessionCache: tls.NewLRUClientSessionCache(8),
		VerifyConnection: func(cs tls.ConnectionState) error {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.leaves = append(r.leaves, cs.PeerCertificates[0].Raw)
			r.resumed = append(r.resumed, cs.DidResume)
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sqldriver.DeregisterTLSConfig(name) })
	return name
}

// last returns the latest handshake's certificate and whether it resumed.
func (r *certRecorder) last() ([]byte, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.leaves) == 0 {
		return nil, false
	}
	return r.leaves[len(r.leaves)-1], r.resumed[len(r.resumed)-1]
}

func TestSetClientCertificateWhileServing(t *testing.T) {
	be := reloadBackend(t)
	certA, certB := selfSigned(t), selfSigned(t)
	s, addr := startProxy(t, Config{
		BackendAddr: be.ln.Addr().String(),
		ClientTLS:   &tls.Config{Certificates: []tls.Certificate{certA}},
		RequireTLS:  true,
	})
	var rec certRecorder
	name := rec.register(t)

	old := holdSession(t, addr, name)
	if leaf, _ := rec.last(); !bytes.Equal(leaf, certA.Certificate[0]) {
		t.Fatal("first session was not offered the start-up certificate")
	}
	// The client now holds a session ticket: the next login resumes.
	if err := pingNew(t, addr, name); err != nil {
		t.Fatal(err)
	}
	if leaf, resumed := rec.last(); !resumed || !bytes.Equal(leaf, certA.Certificate[0]) {
		t.Fatalf("second login: resumed %v, start-up certificate %v", resumed, bytes.Equal(leaf, certA.Certificate[0]))
	}
	if err := s.SetClientCertificate(certB); err != nil {
		t.Fatal(err)
	}
	if err := pingNew(t, addr, name); err != nil {
		t.Fatalf("session after the new certificate: %v", err)
	}
	if leaf, resumed := rec.last(); resumed || !bytes.Equal(leaf, certB.Certificate[0]) {
		t.Fatalf("login after the new certificate: resumed %v (a ticket of the old one), new certificate %v", resumed, bytes.Equal(leaf, certB.Certificate[0]))
	}
	if err := old.PingContext(context.Background()); err != nil {
		t.Fatalf("session opened under the old certificate hurt: %v", err)
	}

	// Concurrent replacements and handshakes (go test -race).
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := s.SetClientCertificate(certA); err != nil {
				t.Error(err)
			}
		}()
		go func() {
			defer wg.Done()
			if err := pingNew(t, addr, name); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()

	if err := s.SetClientCertificate(tls.Certificate{}); err == nil {
		t.Fatal("an empty certificate must be refused")
	}
}

func TestSetClientCertificateNeedsClientTLS(t *testing.T) {
	s, err := NewServer(Config{BackendAddr: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetClientCertificate(selfSigned(t)); !errors.Is(err, ErrNoClientTLS) {
		t.Fatalf("want ErrNoClientTLS, got %v", err)
	}
}

// A ClientTLS with its own GetCertificate keeps using it until a
// certificate is set.
func TestReloadableTLSKeepsOwnGetCertificate(t *testing.T) {
	own := selfSigned(t)
	s, err := NewServer(Config{BackendAddr: "127.0.0.1:1", ClientTLS: &tls.Config{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &own, nil },
	}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.cfg.ClientTLS.GetCertificate(&tls.ClientHelloInfo{})
	if err != nil || !bytes.Equal(got.Certificate[0], own.Certificate[0]) {
		t.Fatalf("own GetCertificate not used: %v", err)
	}
	set := selfSigned(t)
	if err := s.SetClientCertificate(set); err != nil {
		t.Fatal(err)
	}
	if got, _ = s.cfg.ClientTLS.GetCertificate(&tls.ClientHelloInfo{}); !bytes.Equal(got.Certificate[0], set.Certificate[0]) {
		t.Fatal("the set certificate does not win over the own GetCertificate")
	}
}
