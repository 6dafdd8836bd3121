package tokenserver

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// rgserver knows two kinds of caller (README, "rgserver: who may call
// it"): proxies, which stream tokens, watch and read, and administrators,
// which may also change groups, bindings and runaway watches. Each is
// authenticated by a bearer token of its kind or by its verified client
// certificate. With no credential configured at all, authentication is
// off and every caller is an anonymous administrator: cmd/rgserver allows
// that only on a loopback address or with --insecure.

// ErrAuthConfig marks an invalid authentication setting (a malformed
// proxy token file, a token given twice).
var ErrAuthConfig = errors.New("tokenserver: invalid authentication config")

// Role is what an authenticated caller may do.
type Role uint8

const (
	// RoleProxy may call AcquireTokens, Watch, the reads (GetGroup,
	// ListGroups, GetBinding, ListBindings, ListWatches), the cluster
	// views (Inspect, ClusterInspect), the runaway history
	// (RecordRunaways, ListRunaways), the usage history and the budgets
	// (UsageHistory, Budgets).
	RoleProxy Role = iota + 1
	// RoleAdmin may call everything.
	RoleAdmin
)

func (r Role) String() string {
	switch r {
	case RoleProxy:
		return "proxy"
	case RoleAdmin:
		return "admin"
	}
	return "none"
}

// Principal is an authenticated caller.
type Principal struct {
	// Name names the credential: a proxy token's name, "admin" for the
	// admin token, "cert:<identity>" for a client certificate; "" when
	// authentication is off.
	Name string
	Role Role
	// MaxStreams bounds what the credential holds at once: live
	// AcquireTokens streams and proxy ids with slots (proxies.go). 0 =
	// unbounded (administrators, and everyone when authentication is off).
	MaxStreams int
}

// ProxyCredential is one line of --proxy-token-file.
type ProxyCredential struct {
	// Name identifies the credential in logs and in its proxies' slot ids.
	Name string
	// Token is the bearer token proxies send.
	Token string
	// MaxStreams is how many proxies may use the credential at once. Default 1.
	MaxStreams int
}

// MinProxyTokenLen is the shortest proxy token accepted, in bytes.
const MinProxyTokenLen = 16

// ParseProxyTokens reads a proxy token file: one credential per line as
// "<name> <token> [max-streams]" (max-streams default 1), or a file whose
// only content is one token (named "proxy", one stream). Blank lines and
// lines starting with # are skipped. Names and tokens must be unique and
// tokens at least MinProxyTokenLen bytes.
func ParseProxyTokens(data []byte) ([]ProxyCredential, error) {
	var out []ProxyCredential
	var lines [][]string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		lines = append(lines, strings.Fields(line))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: proxy tokens: %w", ErrAuthConfig, err)
	}
	if len(lines) == 1 && len(lines[0]) == 1 {
		lines[0] = []string{"proxy", lines[0][0]}
	}
	names, tokens := map[string]bool{}, map[string]bool{}
	for i, f := range lines {
		if len(f) < 2 || len(f) > 3 {
			return nil, fmt.Errorf("%w: proxy tokens: entry %d: want \"<name> <token> [max-streams]\", got %d fields", ErrAuthConfig, i+1, len(f))
		}
		c := ProxyCredential{Name: f[0], Token: f[1], MaxStreams: 1}
		if len(f) == 3 {
			n, err := strconv.Atoi(f[2])
			if err != nil || n < 1 {
				return nil, fmt.Errorf("%w: proxy tokens: %s: max-streams %q is not a positive integer", ErrAuthConfig, c.Name, f[2])
			}
			c.MaxStreams = n
		}
		switch {
		case len(c.Token) < MinProxyTokenLen:
			return nil, fmt.Errorf("%w: proxy tokens: %s: the token is shorter than %d bytes", ErrAuthConfig, c.Name, MinProxyTokenLen)
		case names[c.Name]:
			return nil, fmt.Errorf("%w: proxy tokens: name %s given twice", ErrAuthConfig, c.Name)
		case tokens[c.Token]:
			return nil, fmt.Errorf("%w: proxy tokens: %s: token given twice", ErrAuthConfig, c.Name)
		}
		names[c.Name], tokens[c.Token] = true, true
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: proxy tokens: no credential in the file", ErrAuthConfig)
	}
	return out, nil
}

// AuthConfig says who may call rgserver.
type AuthConfig struct {
	// AdminToken is the administrators' bearer token; "" = none.
	AdminToken string
	// ProxyTokens are the proxies' bearer tokens; none by default.
	ProxyTokens []ProxyCredential
	// ClientCerts: the TLS listener requires and verifies client
	// certificates (mTLS), whose identity names the caller. Default false.
	ClientCerts bool
	// TLSAdminNames are the certificate identities (subject CN, DNS, URI
	// or e-mail SAN) that are administrators; every other verified
	// certificate is a proxy. Default none.
	TLSAdminNames []string
	// TLSProxyMaxStreams is how many proxies one proxy certificate
	// identity may be at once. Default 1.
	TLSProxyMaxStreams int
}

// Open reports whether no authentication is configured: every caller is
// then an anonymous administrator.
func (c AuthConfig) Open() bool {
	return c.AdminToken == "" && len(c.ProxyTokens) == 0 && !c.ClientCerts
}

// tokenEntry is a configured bearer token, kept as its SHA-256 digest so
// that comparing costs the same whatever the token's length.
type tokenEntry struct {
	digest [sha256.Size]byte
	p      Principal
}

// Authenticator authenticates and authorizes every gRPC call. Its
// tokens may be replaced while it serves (Reload, on SIGHUP): the
// streams of a credential that is gone, or whose token, role or streams
// changed, are ended.
type Authenticator struct {
	open       bool
	clientCert bool
	adminNames map[string]bool
	certMax    int
	refused    *prometheus.CounterVec

	// tokens are the bearer tokens in force (Reload replaces them).
	tokens atomic.Pointer[[]tokenEntry]
	// live are the running streams of bearer tokens, by id, so that a
	// reload can end those of a revoked one.
	mu     sync.Mutex
	live   map[uint64]liveStream
	nextID uint64
}

// liveStream is one running stream of a bearer token.
type liveStream struct {
	entry  tokenEntry
	cancel context.CancelCauseFunc
}

// ErrRevoked ends the streams of a credential a reload took away.
var ErrRevoked = errors.New("tokenserver: credential revoked")

// Reasons of rgserver_auth_refused_total.
const (
	refusedNoCredential  = "no_credential"
	refusedBadCredential = "bad_credential"
	refusedNotAdmin      = "not_admin"
	refusedStreamLimit   = "stream_limit"
)

// NewAuthenticator checks cfg and returns its Authenticator.
func NewAuthenticator(cfg AuthConfig) (*Authenticator, error) {
	a := &Authenticator{open: cfg.Open(), clientCert: cfg.ClientCerts, adminNames: map[string]bool{}, certMax: cfg.TLSProxyMaxStreams,
		live: map[uint64]liveStream{}}
	if a.certMax <= 0 {
		a.certMax = 1
	}
	a.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rgserver_auth_refused_total",
		Help: "gRPC calls refused: no credential, an unknown bearer token, a proxy credential on an admin RPC, a credential beyond its streams or proxy ids (see \"Security\").",
	}, []string{"reason"})
	for _, r := range []string{refusedNoCredential, refusedBadCredential, refusedNotAdmin, refusedStreamLimit} {
		a.refused.WithLabelValues(r)
	}
	tokens, err := tokensOf(cfg)
	if err != nil {
		return nil, err
	}
	a.tokens.Store(&tokens)
	for _, n := range cfg.TLSAdminNames {
		if n = strings.TrimSpace(n); n != "" {
			a.adminNames[n] = true
		}
	}
	if len(a.adminNames) > 0 && !cfg.ClientCerts {
		return nil, fmt.Errorf("%w: administrator certificate names need client certificates (mTLS)", ErrAuthConfig)
	}
	return a, nil
}

// tokensOf checks and digests cfg's bearer tokens.
func tokensOf(cfg AuthConfig) ([]tokenEntry, error) {
	var out []tokenEntry
	seen := map[[sha256.Size]byte]bool{}
	add := func(token string, p Principal) error {
		d := sha256.Sum256([]byte(token))
		if seen[d] {
			return fmt.Errorf("%w: the same token is given to two credentials (%s)", ErrAuthConfig, p.Name)
		}
		seen[d] = true
		out = append(out, tokenEntry{digest: d, p: p})
		return nil
	}
	if cfg.AdminToken != "" {
		if err := add(cfg.AdminToken, Principal{Name: "admin", Role: RoleAdmin}); err != nil {
			return nil, err
		}
	}
	for _, c := range cfg.ProxyTokens {
		if c.Name == "" || c.Token == "" || c.MaxStreams < 1 {
			return nil, fmt.Errorf("%w: proxy credential %q needs a name, a token and max-streams ≥ 1", ErrAuthConfig, c.Name)
		}
		if err := add(c.Token, Principal{Name: c.Name, Role: RoleProxy, MaxStreams: c.MaxStreams}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Reload replaces the bearer tokens with cfg's (its token files read
// again) and ends the running streams of every token that is gone or
// whose credential changed (name, role, max-streams). Whether
// authentication is on, and client certificates, are chosen at start: a
// cfg that changes them is refused. It returns the credentials added,
// and those revoked (gone or changed), by name.
func (a *Authenticator) Reload(cfg AuthConfig) (added, revoked []string, err error) {
	if cfg.Open() != a.open || cfg.ClientCerts != a.clientCert {
		return nil, nil, fmt.Errorf("%w: turning authentication or client certificates on or off needs a restart", ErrAuthConfig)
	}
	next, err := tokensOf(cfg)
	if err != nil {
		return nil, nil, err
	}
	old := *a.tokens.Load()
	keep := make(map[[sha256.Size]byte]Principal, len(next))
	for _, e := range next {
		keep[e.digest] = e.p
	}
	gone := map[[sha256.Size]byte]bool{}
	had := map[[sha256.Size]byte]Principal{}
	for _, e := range old {
		had[e.digest] = e.p
		if p, ok := keep[e.digest]; !ok || p != e.p {
			gone[e.digest] = true
			revoked = append(revoked, e.p.Name)
		}
	}
	for _, e := range next {
		if p, ok := had[e.digest]; !ok || p != e.p {
			added = append(added, e.p.Name)
		}
	}
	a.tokens.Store(&next)
	a.mu.Lock()
	for id, ls := range a.live {
		if gone[ls.entry.digest] {
			ls.cancel(ErrRevoked)
			delete(a.live, id)
		}
	}
	a.mu.Unlock()
	return added, revoked, nil
}

// track registers a running stream of e; untrack ends the registration.
func (a *Authenticator) track(e tokenEntry, cancel context.CancelCauseFunc) (untrack func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.nextID++
	id := a.nextID
	a.live[id] = liveStream{entry: e, cancel: cancel}
	// A reload between the stream's authentication and now did not see
	// it: check its token again.
	if !a.holds(e) {
		cancel(ErrRevoked)
	}
	return func() {
		a.mu.Lock()
		delete(a.live, id)
		a.mu.Unlock()
	}
}

// holds reports whether the tokens in force hold e as it is.
func (a *Authenticator) holds(e tokenEntry) bool {
	for _, x := range *a.tokens.Load() {
		if x == e {
			return true
		}
	}
	return false
}

// Open reports whether authentication is off.
func (a *Authenticator) Open() bool { return a.open }

// Register adds rgserver_auth_refused_total and rgserver_insecure to r.
func (a *Authenticator) Register(r prometheus.Registerer) error {
	insecure := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "rgserver_insecure",
		Help: "1 when no authentication is configured (loopback by default, or --insecure): every caller may change groups.",
	}, func() float64 {
		if a.open {
			return 1
		}
		return 0
	})
	for _, c := range []prometheus.Collector{a.refused, insecure} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// refuse counts a refusal and returns its status.
func (a *Authenticator) refuse(reason string, code codes.Code, msg string) error {
	a.refused.WithLabelValues(reason).Inc()
	return status.Error(code, msg)
}

// authenticate names the caller of ctx: its bearer token if it sends one
// (a token that matches none is refused, whatever certificate comes with
// it), else its verified client certificate.
func (a *Authenticator) authenticate(ctx context.Context) (Principal, error) {
	p, _, err := a.authenticateEntry(ctx)
	return p, err
}

// authenticateEntry is authenticate that also returns the bearer token's
// entry (a zero entry for a certificate or with authentication off).
func (a *Authenticator) authenticateEntry(ctx context.Context) (Principal, tokenEntry, error) {
	if a.open {
		return Principal{Role: RoleAdmin}, tokenEntry{}, nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if vals := md.Get("authorization"); len(vals) > 0 {
		for _, v := range vals {
			tok, ok := strings.CutPrefix(v, "Bearer ")
			if !ok {
				continue
			}
			if e, ok := a.lookupToken(tok); ok {
				return e.p, e, nil
			}
		}
		return Principal{}, tokenEntry{}, a.refuse(refusedBadCredential, codes.Unauthenticated, "rgserver does not know this bearer token (a credential revoked by a reload is no longer known)")
	}
	if a.clientCert {
		if id, names, ok := certNames(ctx); ok {
			for _, n := range names {
				if a.adminNames[n] {
					return Principal{Name: "cert:" + id, Role: RoleAdmin}, tokenEntry{}, nil
				}
			}
			return Principal{Name: "cert:" + id, Role: RoleProxy, MaxStreams: a.certMax}, tokenEntry{}, nil
		}
	}
	return Principal{}, tokenEntry{}, a.refuse(refusedNoCredential, codes.Unauthenticated,
		`rgserver requires authentication: send "authorization: Bearer <token>" with a token of its --proxy-token-file or --admin-token-file (rgproxy: --token-server-proxy-token-file, --token-server-token-file), or a client certificate its --tls-ca verifies`)
}

// lookupToken compares tok with every configured token in constant time.
func (a *Authenticator) lookupToken(tok string) (tokenEntry, bool) {
	d := sha256.Sum256([]byte(tok))
	var found tokenEntry
	ok := false
	for _, e := range *a.tokens.Load() {
		if subtle.ConstantTimeCompare(d[:], e.digest[:]) == 1 {
			found, ok = e, true
		}
	}
	return found, ok
}

// certNames returns the identity of the caller's verified client
// certificate (its subject CN, else its first DNS, URI or e-mail SAN) and
// every name it carries.
func certNames(ctx context.Context) (id string, names []string, ok bool) {
	pr, ok := peer.FromContext(ctx)
	if !ok {
		return "", nil, false
	}
	ti, ok := pr.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return "", nil, false
	}
	c := ti.State.VerifiedChains[0][0]
	if c.Subject.CommonName != "" {
		names = append(names, c.Subject.CommonName)
	}
	names = append(names, c.DNSNames...)
	for _, u := range c.URIs {
		names = append(names, u.String())
	}
	names = append(names, c.EmailAddresses...)
	if len(names) == 0 {
		return "", nil, false
	}
	return names[0], names, true
}

// IsAdminMethod reports whether a full gRPC method name changes settings,
// bindings or runaway watches, and so needs an administrator.
func IsAdminMethod(fullMethod string) bool {
	switch fullMethod {
	case pb.ResourceGroupService_CreateGroup_FullMethodName,
		pb.ResourceGroupService_AlterGroup_FullMethodName,
		pb.ResourceGroupService_DropGroup_FullMethodName,
		pb.ResourceGroupService_BindUser_FullMethodName,
		pb.ResourceGroupService_UnbindUser_FullMethodName,
		pb.ResourceGroupService_AddWatch_FullMethodName,
		pb.ResourceGroupService_RemoveWatch_FullMethodName,
		pb.ResourceGroupService_SetServiceLimit_FullMethodName:
		return true
	}
	return false
}

// authorize authenticates ctx's caller for fullMethod: administrators may
// call everything, proxies every method but the admin ones (server
// reflection included), anyone else nothing.
func (a *Authenticator) authorize(ctx context.Context, fullMethod string) (Principal, error) {
	p, _, err := a.authorizeEntry(ctx, fullMethod)
	return p, err
}

func (a *Authenticator) authorizeEntry(ctx context.Context, fullMethod string) (Principal, tokenEntry, error) {
	p, e, err := a.authenticateEntry(ctx)
	if err != nil {
		return p, e, err
	}
	if IsAdminMethod(fullMethod) && p.Role != RoleAdmin {
		name := fullMethod[strings.LastIndexByte(fullMethod, '/')+1:]
		return p, e, a.refuse(refusedNotAdmin, codes.PermissionDenied, fmt.Sprintf(
			"%s needs an administrator credential (rgserver --admin-token-file or --tls-admin-names; rgproxy --token-server-token-file): %q is a proxy credential", name, p.Name))
	}
	return p, e, nil
}

type principalKey struct{}

// principalFrom returns the caller the interceptors authenticated; a call
// that went through none (a Server used without them, as in tests) is an
// anonymous administrator.
func principalFrom(ctx context.Context) Principal {
	if p, ok := ctx.Value(principalKey{}).(Principal); ok {
		return p
	}
	return Principal{Role: RoleAdmin}
}

// authedStream carries the authenticated caller in its context.
type authedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *authedStream) Context() context.Context { return s.ctx }

// Interceptors returns the unary and stream interceptors that
// authenticate and authorize every call.
func (a *Authenticator) Interceptors() (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		p, err := a.authorize(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return h(context.WithValue(ctx, principalKey{}, p), req)
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		p, e, err := a.authorizeEntry(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		ctx := context.WithValue(ss.Context(), principalKey{}, p)
		if e.p.Role == 0 {
			return h(srv, &authedStream{ServerStream: ss, ctx: ctx})
		}
		// A bearer token's stream ends when a reload revokes the token:
		// the handlers end on their context.
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		untrack := a.track(e, cancel)
		defer untrack()
		err = h(srv, &authedStream{ServerStream: ss, ctx: ctx})
		if errors.Is(context.Cause(ctx), ErrRevoked) {
			return status.Errorf(codes.PermissionDenied, "credential %q was revoked: rgserver's token files no longer hold its token (or its entry changed)", p.Name)
		}
		return err
	}
	return unary, stream
}
