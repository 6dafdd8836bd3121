package tests

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// rgsServer is a running rgserver process.
type rgsServer struct {
	*process
	Addr, StatusAddr string
	conn             *grpc.ClientConn
}

// rgsSpawn runs rgserver on the given gRPC and status addresses without
// waiting for it (members of a new etcd cluster listen only once a quorum
// has formed).
func rgsSpawn(t *testing.T, addr, statusAddr string, extra ...string) *rgsServer {
	t.Helper()
	args := append([]string{"--addr", addr, "--status-addr", statusAddr, "--log-level", "debug"}, extra...)
	s := &rgsServer{Addr: addr, StatusAddr: statusAddr}
	s.process = startProcess(t, "rgserver", args...)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	s.conn = conn
	t.Cleanup(func() { conn.Close() })
	return s
}

// rgsStart is rgsSpawn, then waits until the status port listens.
func rgsStart(t *testing.T, addr, statusAddr string, extra ...string) *rgsServer {
	t.Helper()
	s := rgsSpawn(t, addr, statusAddr, extra...)
	waitListening(t, statusAddr, s.process)
	return s
}

// rgsWaitReady polls /readyz until it answers 200.
func rgsWaitReady(t *testing.T, s *rgsServer, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			t.Fatalf("rgserver %s exited: %v\n%s", s.Addr, s.err, s.log.String())
		default:
		}
		if resp, err := http.Get("http://" + s.StatusAddr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("rgserver %s not ready after %v\n%s", s.Addr, within, s.log.String())
}

// rgsAcquire opens a token stream to s and asks for tokens of group once.
func rgsAcquire(ctx context.Context, s *rgsServer, group string) (*pb.TokenResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := pb.NewTokenServiceClient(s.conn).AcquireTokens(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.Send(&pb.TokenRequest{ProxyId: "e2e", RequestId: 1, Groups: []*pb.GroupTokenRequest{
		{Group: group, TokensWanted: 10, DemandRuPerSec: 10},
	}}); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	// Send reports io.EOF when the server has already ended the stream
	// (a refused credential); the stream's status comes from Recv.
	return st.Recv()
}

func TestRgserverRestartKeepsGroups(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "admin-token")
	if err := os.WriteFile(tokenFile, []byte("e2e-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, statusAddr := freeAddr(t), freeAddr(t)
	args := []string{"--data-dir", filepath.Join(dir, "data"), "--admin-token-file", tokenFile}
	s := rgsStart(t, addr, statusAddr, args...)
	rgsWaitReady(t, s, 15*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rg := pb.NewResourceGroupServiceClient(s.conn)
	if _, err := rg.CreateGroup(ctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "app", RuPerSec: 500}}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("create without the admin token: %v", err)
	}
	if _, err := rgsAcquire(ctx, s, "app"); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("tokens without a credential: %v", err)
	}
	admin := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer e2e-token")
	if _, err := rg.CreateGroup(admin, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{
		Name: "app", RuPerSec: 500, Priority: pb.Priority_PRIORITY_HIGH, Burst: pb.BurstMode_BURST_MODERATED,
		QueryLimit: &pb.QueryLimit{ExecElapsedMs: 60000, Action: pb.Action_ACTION_KILL},
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := rg.BindUser(admin, &pb.BindUserRequest{Binding: &pb.Binding{User: "webapp", Host: "%", Group: "app"}}); err != nil {
		t.Fatal(err)
	}
	resp, err := rgsAcquire(admin, s, "app")
	if err != nil || len(resp.Grants) != 1 || resp.Grants[0].Tokens != 10 {
		t.Fatalf("grant before restart: %v %v", resp, err)
	}
	if code, body := httpGet(t, "http://"+statusAddr+"/metrics"); code != 200 || !strings.Contains(body, `rgserver_group_ru_per_sec{resource_group="app"} 500`) {
		t.Fatalf("/metrics %d:\n%s", code, body)
	}
	if err := s.stop(10 * time.Second); err != nil {
		t.Fatalf("rgserver did not exit cleanly on SIGTERM: %v\n%s", err, s.log.String())
	}

	s2 := rgsStart(t, addr, statusAddr, args...)
	rgsWaitReady(t, s2, 15*time.Second)
	rg2 := pb.NewResourceGroupServiceClient(s2.conn)
	g, err := rg2.GetGroup(admin, &pb.GetGroupRequest{Name: "app"})
	if err != nil {
		t.Fatalf("group lost over restart: %v", err)
	}
	if g.Group.RuPerSec != 500 || g.Group.Priority != pb.Priority_PRIORITY_HIGH || g.Group.Burst != pb.BurstMode_BURST_MODERATED ||
		g.Group.QueryLimit.GetExecElapsedMs() != 60000 || g.Group.QueryLimit.GetAction() != pb.Action_ACTION_KILL {
		t.Fatalf("group after restart: %v", g.Group)
	}
	b, err := rg2.GetBinding(admin, &pb.GetBindingRequest{User: "webapp"})
	if err != nil || b.Binding.Group != "app" || b.Binding.Host != "%" {
		t.Fatalf("binding after restart: %v %v", b, err)
	}
	resp, err = rgsAcquire(admin, s2, "app")
	if err != nil || len(resp.Grants) != 1 || resp.Grants[0].Error != "" {
		t.Fatalf("grant after restart: %v %v", resp, err)
	}
}

func TestRgserverThreeReplicasFailover(t *testing.T) {
	dir := t.TempDir()
	type member struct{ name, addr, status, peer string }
	var ms []member
	var cluster []string
	for _, n := range []string{"rgs1", "rgs2", "rgs3"} {
		m := member{name: n, addr: freeAddr(t), status: freeAddr(t), peer: "http://" + freeAddr(t)}
		ms = append(ms, m)
		cluster = append(cluster, m.name+"="+m.peer)
	}
	servers := make([]*rgsServer, len(ms))
	for i, m := range ms {
		servers[i] = rgsSpawn(t, m.addr, m.status,
			"--name", m.name, "--data-dir", filepath.Join(dir, m.name),
			"--etcd-peer-addr", m.peer, "--etcd-initial-cluster", strings.Join(cluster, ","),
			"--election-ttl", "3s")
	}
	for _, s := range servers {
		rgsWaitReady(t, s, 60*time.Second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	rg := pb.NewResourceGroupServiceClient(servers[0].conn)
	for _, name := range []string{"g1", "g2", "g3"} {
		if _, err := rg.CreateGroup(ctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: name, RuPerSec: 100}}); err != nil {
			t.Fatal(err)
		}
	}

	// Find the leader: the one that grants; the others name it.
	leader := -1
	for i, s := range servers {
		resp, err := rgsAcquire(ctx, s, "g1")
		if err != nil {
			t.Fatalf("%s: %v", ms[i].name, err)
		}
		if resp.NotLeader == nil {
			if leader >= 0 {
				t.Fatalf("two leaders: %s and %s", ms[leader].name, ms[i].name)
			}
			leader = i
		}
	}
	if leader < 0 {
		t.Fatal("no replica grants tokens")
	}
	for i, s := range servers {
		if i == leader {
			continue
		}
		resp, _ := rgsAcquire(ctx, s, "g1")
		if resp.GetNotLeader().GetLeaderAddr() != ms[leader].addr {
			t.Fatalf("%s names leader %q, want %s", ms[i].name, resp.GetNotLeader().GetLeaderAddr(), ms[leader].addr)
		}
	}

	killed := time.Now()
	if err := servers[leader].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-servers[leader].done
	var elapsed time.Duration
	newLeader := -1
	for newLeader < 0 {
		if time.Since(killed) > 30*time.Second {
			t.Fatal("no new leader grants within 30 s")
		}
		for i, s := range servers {
			if i == leader {
				continue
			}
			resp, err := rgsAcquire(ctx, s, "g2")
			if err == nil && resp.NotLeader == nil && len(resp.Grants) == 1 && resp.Grants[0].Tokens > 0 {
				newLeader, elapsed = i, time.Since(killed)
				break
			}
		}
		if newLeader < 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	t.Logf("leader %s SIGKILLed; %s granted tokens %v later", ms[leader].name, ms[newLeader].name, elapsed.Round(time.Millisecond))
	if elapsed > 5*time.Second {
		t.Errorf("new leader took %v to grant, want ≤ 5 s", elapsed)
	}
	list, err := pb.NewResourceGroupServiceClient(servers[newLeader].conn).ListGroups(ctx, &pb.ListGroupsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, g := range list.Groups {
		names = append(names, g.Name)
	}
	if strings.Join(names, ",") != "default,g1,g2,g3" {
		t.Fatalf("groups after failover: %v", names)
	}
}

// rgsCerts writes a CA, a server certificate for 127.0.0.1 and a client
// certificate, all PEM, into dir.
func rgsCerts(t *testing.T, dir string) (caFile, certFile, keyFile, clientCert, clientKey string) {
	t.Helper()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caKey := newKey()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rgs test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	issue := func(serial int64, usage x509.ExtKeyUsage, prefix string) (string, string) {
		k := newKey()
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: prefix},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kb, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return write(prefix+".pem", "CERTIFICATE", der), write(prefix+"-key.pem", "PRIVATE KEY", kb)
	}
	caFile = write("ca.pem", "CERTIFICATE", caDER)
	certFile, keyFile = issue(2, x509.ExtKeyUsageServerAuth, "server")
	clientCert, clientKey = issue(3, x509.ExtKeyUsageClientAuth, "client")
	return
}

func TestRgserverMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca, cert, key, ccert, ckey := rgsCerts(t, dir)
	addr, statusAddr := freeAddr(t), freeAddr(t)
	s := rgsStart(t, addr, statusAddr, "--data-dir", filepath.Join(dir, "data"), "--tls-cert", cert, "--tls-key", key, "--tls-ca", ca)
	rgsWaitReady(t, s, 15*time.Second)

	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(ca)
	if err != nil {
		t.Fatal(err)
	}
	pool.AppendCertsFromPEM(caPEM)
	pair, err := tls.LoadX509KeyPair(ccert, ckey)
	if err != nil {
		t.Fatal(err)
	}
	dial := func(tc *tls.Config) *grpc.ClientConn {
		creds := insecure.NewCredentials()
		if tc != nil {
			creds = credentials.NewTLS(tc)
		}
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tests := []struct {
		name string
		conn *grpc.ClientConn
		ok   bool
	}{
		{"client certificate", dial(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}), true},
		{"TLS without client certificate", dial(&tls.Config{RootCAs: pool}), false},
		{"plaintext", dial(nil), false},
	}
	for _, tc := range tests {
		cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := pb.NewResourceGroupServiceClient(tc.conn).ListGroups(cctx, &pb.ListGroupsRequest{})
		ccancel()
		if (err == nil) != tc.ok {
			t.Errorf("%s: err = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
	// Server reflection is on, so grpcurl can list the services.
	rc, err := reflectionpb.NewServerReflectionClient(tests[0].conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	r, err := rc.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var svcs []string
	for _, sv := range r.GetListServicesResponse().GetService() {
		svcs = append(svcs, sv.GetName())
	}
	got := strings.Join(svcs, ",")
	if !strings.Contains(got, "rgproxy.token.v1.TokenService") || !strings.Contains(got, "rgproxy.token.v1.ResourceGroupService") {
		t.Fatalf("reflection lists %v", svcs)
	}
}
