package tests

import (
	"context"
	"database/sql"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// TestAdminTokenGuardsRgserverWrites: with --admin-token-file and
// --proxy-token-file, rgserver's admin RPCs refuse a missing or wrong
// bearer token and a proxy's; an rgproxy with only the proxy token gets a
// clear error on DDL, one with the admin token too manages groups.
func TestAdminTokenGuardsRgserverWrites(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "admin.token")
	proxyFile := filepath.Join(dir, "proxy.token")
	os.WriteFile(tokenFile, []byte("s3cr3t-token\n"), 0o600)
	os.WriteFile(proxyFile, []byte("px pr0xy-token-0123456789 2\n"), 0o600)
	ts := startTokenServer(t, "--admin-token-file", tokenFile, "--proxy-token-file", proxyFile)

	conn, err := grpc.NewClient(ts.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cli := pb.NewResourceGroupServiceClient(conn)
	create := func(ctx context.Context, name string) error {
		_, err := cli.CreateGroup(ctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: name, RuPerSec: 10}})
		return err
	}
	bg := context.Background()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want codes.Code
	}{
		{"no token", bg, codes.Unauthenticated},
		{"wrong token", metadata.AppendToOutgoingContext(bg, "authorization", "Bearer nope"), codes.Unauthenticated},
		{"proxy token", metadata.AppendToOutgoingContext(bg, "authorization", "Bearer pr0xy-token-0123456789"), codes.PermissionDenied},
	} {
		if err := create(tc.ctx, "sec_"+strings.ReplaceAll(tc.name, " ", "_")); status.Code(err) != tc.want {
			t.Errorf("%s: want %v, got %v", tc.name, tc.want, err)
		}
	}
	if err := create(metadata.AppendToOutgoingContext(bg, "authorization", "Bearer s3cr3t-token"), "sec_ok"); err != nil {
		t.Fatalf("right token: %v", err)
	}

	// A proxy without the admin token gets a clear error; with it, it works.
	without := startMeteredProxy(t, ts, "--token-server-proxy-token-file", proxyFile)
	_, err = openDB(t, without.Addr).Exec("CREATE RESOURCE GROUP sec_px RU_PER_SEC = 10")
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "administrator credential") {
		t.Fatalf("CREATE through a proxy without the admin token: %v", err)
	}
	with := startMeteredProxy(t, ts, "--token-server-token-file", tokenFile, "--token-server-proxy-token-file", proxyFile)
	adminExec(t, with.Addr, "DROP RESOURCE GROUP IF EXISTS sec_px", "CREATE RESOURCE GROUP sec_px RU_PER_SEC = 10")
	for _, secret := range []string{"s3cr3t-token", "pr0xy-token-0123456789"} {
		if strings.Contains(with.log.String(), secret) || strings.Contains(without.log.String(), secret) || strings.Contains(ts.log.String(), secret) {
			t.Fatalf("a token reached a log")
		}
	}
}

// TestLogsHoldNoPasswordsAndOnlyDigests: at debug level, rgproxy's log
// holds neither passwords (right or wrong) nor statement literals.
func TestLogsHoldNoPasswordsAndOnlyDigests(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts, "--log-level", "debug", "--max-wait", "100ms")
	rootExec(t, "CREATE USER IF NOT EXISTS 'seclog'@'%' IDENTIFIED BY 'Pa55-w0rd-42'",
		"GRANT SELECT ON rgproxy_e2e.* TO 'seclog'@'%'")
	ok := openDB(t, px.Addr, "user=seclog", "password=Pa55-w0rd-42")
	ok.Exec("SELECT 1")
	bad, _ := sql.Open("mysql", dsn(px.Addr, "user=seclog", "password=Wr0ng-pa55-99"))
	if err := bad.Ping(); mysqlErrNo(err) != 1045 {
		t.Fatalf("wrong password: %v", err)
	}
	bad.Close()

	// A throttled statement is logged, as a digest only.
	adminExec(t, px.Addr, "DROP RESOURCE GROUP IF EXISTS sec_tiny", "CREATE RESOURCE GROUP sec_tiny RU_PER_SEC = 1")
	db := openDB(t, px.Addr)
	db.SetMaxOpenConns(1)
	db.Exec("SET RESOURCE GROUP sec_tiny")
	var refused bool
	for i := 0; i < 20 && !refused; i++ {
		_, err := db.Exec("SELECT 'literal-topsecret-7', 12345678")
		refused = mysqlErrNo(err) == 8252
	}
	if !refused {
		t.Fatal("no statement was throttled")
	}
	time.Sleep(100 * time.Millisecond)
	log := px.log.String()
	for _, secret := range []string{"Pa55-w0rd-42", "Wr0ng-pa55-99", "literal-topsecret-7", "12345678"} {
		if strings.Contains(log, secret) {
			t.Errorf("rgproxy's log holds %q", secret)
		}
	}
	if !strings.Contains(log, "statement throttled") || !strings.Contains(log, "SELECT ?, ?") {
		t.Errorf("the throttled statement is not logged as its digest:\n%s", log)
	}
}

// TestConnectionStormRefusedCleanly: a client opening thousands of
// connections per second beyond --max-connections gets 1040 (or a closed
// connection) quickly, while existing sessions keep working.
func TestConnectionStormRefusedCleanly(t *testing.T) {
	px := startProxy(t, "--max-connections", "8")
	db := openDB(t, px.Addr)
	db.SetMaxOpenConns(4)
	// Existing sessions: four clients in a loop through the storm.
	var stmts, errs atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := db.Conn(context.Background())
			if err != nil {
				errs.Add(1)
				return
			}
			defer conn.Close()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := conn.ExecContext(context.Background(), "SELECT 1"); err != nil {
					errs.Add(1)
				} else {
					stmts.Add(1)
				}
			}
		}()
	}
	time.Sleep(200 * time.Millisecond)
	// The storm: raw TCP connections that read the first packet and hang up.
	const total = 10000
	var refused, greeted, failed atomic.Int64
	start := time.Now()
	var storm sync.WaitGroup
	next := atomic.Int64{}
	for w := 0; w < 32; w++ {
		storm.Add(1)
		go func() {
			defer storm.Done()
			buf := make([]byte, 512)
			for next.Add(1) <= total {
				c, err := net.DialTimeout("tcp", px.Addr, 2*time.Second)
				if err != nil {
					failed.Add(1)
					continue
				}
				c.SetDeadline(time.Now().Add(2 * time.Second))
				n, _ := c.Read(buf)
				c.Close()
				switch {
				case n > 7 && buf[4] == 0xff && buf[5] == 0x10 && buf[6] == 0x04: // ERR 1040
					refused.Add(1)
				case n > 4 && buf[4] == 0x0a: // a greeting (protocol 10)
					greeted.Add(1)
				default:
					failed.Add(1)
				}
			}
		}()
	}
	storm.Wait()
	took := time.Since(start)
	close(stop)
	wg.Wait()
	rate := float64(total) / took.Seconds()
	t.Logf("storm: %d connections in %v (%.0f/s): %d refused with 1040, %d greeted, %d failed; existing sessions ran %d statements, %d errors",
		total, took.Round(time.Millisecond), rate, refused.Load(), greeted.Load(), failed.Load(), stmts.Load(), errs.Load())
	if errs.Load() != 0 {
		t.Fatalf("existing sessions failed %d times during the storm", errs.Load())
	}
	if refused.Load() < total/2 {
		t.Fatalf("only %d of %d storm connections were refused with 1040", refused.Load(), total)
	}
	if failed.Load() > total/100 {
		t.Fatalf("%d storm connections got neither 1040 nor a greeting", failed.Load())
	}
	// After the storm the proxy accepts new sessions again.
	after := openDB(t, px.Addr)
	if err := after.Ping(); err != nil {
		t.Fatalf("new session after the storm: %v", err)
	}
}
