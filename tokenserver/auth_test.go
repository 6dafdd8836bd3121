package tokenserver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

func TestParseProxyTokens(t *testing.T) {
	tok := "0123456789abcdef"
	tests := []struct {
		name, file string
		want       []ProxyCredential
		err        string
	}{
		{"one bare token", tok + "\n", []ProxyCredential{{"proxy", tok, 1}}, ""},
		{"named lines", "# proxies\n\npx1 " + tok + "\npx2 " + tok + "X 3\n",
			[]ProxyCredential{{"px1", tok, 1}, {"px2", tok + "X", 3}}, ""},
		{"empty", "# nothing\n", nil, "no credential"},
		{"short token", "px1 short\n", nil, "shorter than 16"},
		{"bad streams", "px1 " + tok + " 0\n", nil, "not a positive integer"},
		{"too many fields", "px1 " + tok + " 1 x\n", nil, "fields"},
		{"name twice", "px1 " + tok + "\npx1 " + tok + "X\n", nil, "given twice"},
		{"token twice", "px1 " + tok + "\npx2 " + tok + "\n", nil, "token given twice"},
		{"bare token among lines", tok + "\npx2 " + tok + "X\n", nil, "fields"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseProxyTokens([]byte(tc.file))
			if tc.err != "" {
				if !errors.Is(err, ErrAuthConfig) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want ErrAuthConfig with %q", err, tc.err)
				}
				if err != nil && strings.Contains(err.Error(), tok) {
					t.Fatalf("the error shows the token: %v", err)
				}
				return
			}
			if err != nil || len(got) != len(tc.want) {
				t.Fatalf("got %v, %v", got, err)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("entry %d = %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

// certCtx is the context of a call whose TLS handshake verified a client
// certificate with these names.
func certCtx(cn string, dns ...string) context.Context {
	c := &x509.Certificate{Subject: pkix.Name{CommonName: cn}, DNSNames: dns}
	if cn == "spiffe" {
		c.Subject.CommonName = ""
		c.URIs = []*url.URL{{Scheme: "spiffe", Host: "example.org", Path: "/admin"}}
	}
	st := tls.ConnectionState{PeerCertificates: []*x509.Certificate{c}, VerifiedChains: [][]*x509.Certificate{{c}}}
	return peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{State: st}})
}

func bearer(ctx context.Context, tok string) context.Context {
	return metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+tok))
}

func TestAuthorize(t *testing.T) {
	const adminTok, proxyTok = "admin-token-0123456789", "proxy-token-0123456789"
	tokens := AuthConfig{AdminToken: adminTok, ProxyTokens: []ProxyCredential{{Name: "px", Token: proxyTok, MaxStreams: 3}}}
	mtls := AuthConfig{ClientCerts: true, TLSAdminNames: []string{"ops", "spiffe://example.org/admin"}, TLSProxyMaxStreams: 2}
	both := tokens
	both.ClientCerts, both.TLSAdminNames = true, []string{"ops"}
	bg := context.Background()
	// an unverified certificate identifies nobody
	unverified := peer.NewContext(bg, &peer.Peer{AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{
		PeerCertificates: []*x509.Certificate{{Subject: pkix.Name{CommonName: "ops"}}}}}})

	const (
		create = pb.ResourceGroupService_CreateGroup_FullMethodName
		list   = pb.ResourceGroupService_ListWatches_FullMethodName
		acq    = pb.TokenService_AcquireTokens_FullMethodName
		refl   = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
		insp   = pb.InspectService_Inspect_FullMethodName
		view   = pb.InspectService_ClusterInspect_FullMethodName
	)
	tests := []struct {
		name   string
		cfg    AuthConfig
		ctx    context.Context
		method string
		code   codes.Code
		who    Principal // when OK
		reason string    // counted when refused
	}{
		{"open: anyone administers", AuthConfig{}, bg, create, codes.OK, Principal{Role: RoleAdmin}, ""},
		{"no credential: no create", tokens, bg, create, codes.Unauthenticated, Principal{}, refusedNoCredential},
		{"no credential: no list", tokens, bg, list, codes.Unauthenticated, Principal{}, refusedNoCredential},
		{"no credential: no tokens", tokens, bg, acq, codes.Unauthenticated, Principal{}, refusedNoCredential},
		{"no credential: no reflection", tokens, bg, refl, codes.Unauthenticated, Principal{}, refusedNoCredential},
		{"wrong token", tokens, bearer(bg, "nope"), list, codes.Unauthenticated, Principal{}, refusedBadCredential},
		{"not a bearer", tokens, metadata.NewIncomingContext(bg, metadata.Pairs("authorization", proxyTok)), list, codes.Unauthenticated, Principal{}, refusedBadCredential},
		{"proxy lists", tokens, bearer(bg, proxyTok), list, codes.OK, Principal{Name: "px", Role: RoleProxy, MaxStreams: 3}, ""},
		{"proxy streams", tokens, bearer(bg, proxyTok), acq, codes.OK, Principal{Name: "px", Role: RoleProxy, MaxStreams: 3}, ""},
		{"proxy reflects", tokens, bearer(bg, proxyTok), refl, codes.OK, Principal{Name: "px", Role: RoleProxy, MaxStreams: 3}, ""},
		{"proxy cannot create", tokens, bearer(bg, proxyTok), create, codes.PermissionDenied, Principal{}, refusedNotAdmin},
		{"no credential: no inspect stream", tokens, bg, insp, codes.Unauthenticated, Principal{}, refusedNoCredential},
		{"no credential: no cluster view", tokens, bg, view, codes.Unauthenticated, Principal{}, refusedNoCredential},
		{"proxy inspect stream", tokens, bearer(bg, proxyTok), insp, codes.OK, Principal{Name: "px", Role: RoleProxy, MaxStreams: 3}, ""},
		{"proxy cluster view", tokens, bearer(bg, proxyTok), view, codes.OK, Principal{Name: "px", Role: RoleProxy, MaxStreams: 3}, ""},
		{"admin cluster view", tokens, bearer(bg, adminTok), view, codes.OK, Principal{Name: "admin", Role: RoleAdmin}, ""},
		{"admin creates", tokens, bearer(bg, adminTok), create, codes.OK, Principal{Name: "admin", Role: RoleAdmin}, ""},
		{"admin streams unbounded", tokens, bearer(bg, adminTok), acq, codes.OK, Principal{Name: "admin", Role: RoleAdmin}, ""},
		{"a certificate means nothing without mTLS", tokens, certCtx("ops"), create, codes.Unauthenticated, Principal{}, refusedNoCredential},
		{"admin certificate", mtls, certCtx("ops"), create, codes.OK, Principal{Name: "cert:ops", Role: RoleAdmin}, ""},
		{"admin by URI SAN", mtls, certCtx("spiffe"), create, codes.OK, Principal{Name: "cert:spiffe://example.org/admin", Role: RoleAdmin}, ""},
		{"admin by DNS SAN", mtls, certCtx("px9", "ops"), create, codes.OK, Principal{Name: "cert:px9", Role: RoleAdmin}, ""},
		{"proxy certificate streams", mtls, certCtx("px7"), acq, codes.OK, Principal{Name: "cert:px7", Role: RoleProxy, MaxStreams: 2}, ""},
		{"proxy certificate cannot create", mtls, certCtx("px7"), create, codes.PermissionDenied, Principal{}, refusedNotAdmin},
		{"unverified certificate", mtls, unverified, list, codes.Unauthenticated, Principal{}, refusedNoCredential},
		{"a bad token is not saved by a certificate", both, bearer(certCtx("ops"), "nope"), list, codes.Unauthenticated, Principal{}, refusedBadCredential},
		{"a token wins over a certificate", both, bearer(certCtx("ops"), proxyTok), create, codes.PermissionDenied, Principal{}, refusedNotAdmin},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, err := NewAuthenticator(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			p, err := a.authorize(tc.ctx, tc.method)
			if status.Code(err) != tc.code {
				t.Fatalf("got %v, want %v", err, tc.code)
			}
			if tc.code == codes.OK && p != tc.who {
				t.Fatalf("caller %+v, want %+v", p, tc.who)
			}
			for _, r := range []string{refusedNoCredential, refusedBadCredential, refusedNotAdmin} {
				want := 0.0
				if r == tc.reason {
					want = 1
				}
				if got := testutil.ToFloat64(a.refused.WithLabelValues(r)); got != want {
					t.Errorf("refused{%s} = %v, want %v", r, got, want)
				}
			}
			if err != nil && (strings.Contains(err.Error(), adminTok) || strings.Contains(err.Error(), proxyTok)) {
				t.Fatalf("the refusal shows a token: %v", err)
			}
		})
	}
}

func TestNewAuthenticatorRefusesBadConfig(t *testing.T) {
	for name, cfg := range map[string]AuthConfig{
		"admin token reused by a proxy": {AdminToken: "same-token-0123456789", ProxyTokens: []ProxyCredential{{Name: "px", Token: "same-token-0123456789", MaxStreams: 1}}},
		"admin names without mTLS":      {AdminToken: "x", TLSAdminNames: []string{"ops"}},
		"proxy without streams":         {ProxyTokens: []ProxyCredential{{Name: "px", Token: "0123456789abcdef"}}},
	} {
		if _, err := NewAuthenticator(cfg); !errors.Is(err, ErrAuthConfig) {
			t.Errorf("%s: %v, want ErrAuthConfig", name, err)
		}
	}
}

func TestInsecureGauge(t *testing.T) {
	for _, tc := range []struct {
		cfg  AuthConfig
		want float64
	}{{AuthConfig{}, 1}, {AuthConfig{AdminToken: "x"}, 0}, {AuthConfig{ClientCerts: true}, 0}} {
		a, err := NewAuthenticator(tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewRegistry()
		if err := a.Register(reg); err != nil {
			t.Fatal(err)
		}
		if got, err := testutil.GatherAndCount(reg, "rgserver_insecure"); err != nil || got != 1 {
			t.Fatalf("rgserver_insecure series: %d, %v", got, err)
		}
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == "rgserver_insecure" && mf.GetMetric()[0].GetGauge().GetValue() != tc.want {
				t.Errorf("%+v: rgserver_insecure = %v, want %v", tc.cfg, mf.GetMetric()[0].GetGauge().GetValue(), tc.want)
			}
		}
	}
}

// idleStream is a server stream whose handler waits for its context.
type idleStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s idleStream) Context() context.Context { return s.ctx }

// TestAuthReload: a reload revokes a credential taken out of the files
// (its running streams end with PermissionDenied and its token is no
// longer known), keeps the streams of those left as they were, lets a
// new one in, and refuses to turn authentication off.
func TestAuthReload(t *testing.T) {
	tokA, tokB, tokC := "aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb", "cccccccccccccccc"
	a, err := NewAuthenticator(AuthConfig{AdminToken: "adminadminadmin0", ProxyTokens: []ProxyCredential{{"a", tokA, 1}, {"b", tokB, 1}}})
	if err != nil {
		t.Fatal(err)
	}
	_, streamInt := a.Interceptors()
	base, cancel := context.WithCancel(context.Background())
	run := func(tok string) chan error {
		done := make(chan error, 1)
		ctx := metadata.NewIncomingContext(base, metadata.Pairs("authorization", "Bearer "+tok))
		go func() {
			done <- streamInt(nil, idleStream{ctx: ctx}, &grpc.StreamServerInfo{FullMethod: pb.TokenService_AcquireTokens_FullMethodName},
				func(_ any, ss grpc.ServerStream) error {
					<-ss.Context().Done()
					return status.FromContextError(ss.Context().Err()).Err()
				})
		}()
		return done
	}
	doneA, doneB := run(tokA), run(tokB)
	// Let both register before the reload.
	for {
		a.mu.Lock()
		n := len(a.live)
		a.mu.Unlock()
		if n == 2 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	added, revoked, err := a.Reload(AuthConfig{AdminToken: "adminadminadmin0", ProxyTokens: []ProxyCredential{{"b", tokB, 1}, {"c", tokC, 1}}})
	if err != nil || len(added) != 1 || added[0] != "c" || len(revoked) != 1 || revoked[0] != "a" {
		t.Fatalf("reload: added %v, revoked %v, %v", added, revoked, err)
	}
	if err := <-doneA; status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("the revoked credential's stream ended with %v", err)
	}
	select {
	case err := <-doneB:
		t.Fatalf("a kept credential's stream ended: %v", err)
	default:
	}
	bearer := func(tok string) context.Context {
		return metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+tok))
	}
	if _, err := a.authenticate(bearer(tokA)); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("the revoked token: %v", err)
	}
	if p, err := a.authenticate(bearer(tokC)); err != nil || p.Name != "c" {
		t.Fatalf("the new token: %v %v", p, err)
	}
	if _, _, err := a.Reload(AuthConfig{}); !errors.Is(err, ErrAuthConfig) {
		t.Fatalf("turning authentication off: %v", err)
	}
	cancel()
	<-doneB
}
