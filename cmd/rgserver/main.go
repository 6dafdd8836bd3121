// Command rgserver is the token server of rgproxy: it keeps resource group
// settings and user bindings in etcd (embedded by default) and hands out
// tokens from one global bucket per group to every proxy over gRPC. Several
// replicas elect one leader through etcd.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"golang.org/x/sync/errgroup"

	"github.com/rgproxy/rgproxy/internal/netaddr"
	"github.com/rgproxy/rgproxy/internal/reload"
	"github.com/rgproxy/rgproxy/internal/statuspage"
	"github.com/rgproxy/rgproxy/tokenserver"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, err)
		if errors.Is(err, errUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

func run(args []string, stdout, stderr io.Writer) error {
	cfg, showVersion, err := parseArgs(args, stderr)
	if err != nil {
		return err
	}
	if showVersion {
		fmt.Fprintln(stdout, "rgserver", versionString())
		return nil
	}
	// SIGHUP applies the configuration again (reload.go); caught before
	// etcd starts so that an early one does not kill the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	rl := &reloader{args: args, cur: cfg, level: new(slog.LevelVar)}
	l, _ := parseLevel(cfg.LogLevel) // validated
	rl.level.Set(l)
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: rl.level}))
	rl.log = log
	// rgserver keeps Go's default GC (GOGC=100): its resident memory
	// stays about twice its live heap whatever a peer sends. It once set
	// GOGC=400 for a few percent of CPU, which let garbage — 200,000
	// unknown group names from one stream — take 70 MiB more (issue 23);
	// make bench-server measured the paced 100,000-group run at 8.50
	// against 8.35 µs of CPU per grant and 310 against 501 MiB. GOGC in
	// the environment still wins.

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	// etcd: embedded member, or an existing cluster.
	endpoints := splitList(cfg.EtcdEndpoints)
	if len(endpoints) == 0 {
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return fmt.Errorf("data dir: %w", err)
		}
		e, err := tokenserver.StartEmbeddedEtcd(ctx, tokenserver.EmbedConfig{
			Name: cfg.Name, DataDir: cfg.DataDir, PeerURL: cfg.EtcdPeerAddr, InitialCluster: cfg.EtcdInitialCluster,
			CompactionRetention: cfg.EtcdCompactionRetention, QuotaBackendBytes: cfg.EtcdQuotaBackendBytes,
		})
		if err != nil {
			return err
		}
		defer e.Close()
		endpoints = e.Endpoints
		log.Info("embedded etcd ready", "name", cfg.Name, "data_dir", cfg.DataDir, "peer", cfg.EtcdPeerAddr)
	}
	cli, err := tokenserver.NewEtcdClient(endpoints)
	if err != nil {
		return err
	}
	defer cli.Close()

	auth, err := authenticator(cfg)
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv, err := tokenserver.New(cli, tokenserver.Config{
		Alloc:             tokenserver.AllocConfig{ClientExpiry: cfg.ClientExpiry},
		AdvertiseAddr:     cfg.AdvertiseAddr,
		ElectionTTL:       cfg.ElectionTTL,
		PersistInterval:   cfg.PersistInterval,
		RunawayRetention:  cfg.RunawayHistoryRetention,
		BudgetLocation:    cfg.budgetLoc,
		BudgetDayLength:   cfg.BudgetDayLength,
		MaxDigestBindings: cfg.MaxDigestBindings,
		ServiceLimit:      cfg.ServiceLimit,
		Logger:            log,
		Registerer:        reg,
		Auth:              auth,
	})
	if err != nil {
		return err
	}

	creds := insecure.NewCredentials()
	if cfg.TLSCert != "" {
		tc, err := serverTLS(cfg, rl)
		if err != nil {
			return err
		}
		creds = credentials.NewTLS(tc)
	} else if !netaddr.IsLoopback(cfg.Addr) && !auth.Open() {
		log.Warn("gRPC listens beyond loopback without TLS: bearer tokens travel in clear; add --tls-cert and --tls-key", "addr", cfg.Addr)
	}
	switch {
	case auth.Open() && cfg.Insecure:
		log.Warn("INSECURE: --insecure given, rgserver authenticates nobody: anyone who reaches its gRPC address may create, alter and drop resource groups, bind users and take tokens",
			"addr", cfg.Addr)
	case auth.Open():
		log.Warn("no authentication configured: anyone on this host may change resource groups and take tokens (gRPC listens on loopback only); see docs/security.md",
			"addr", cfg.Addr)
	case cfg.AdminTokenFile == "" && cfg.TLSAdminNames == "":
		log.Warn("no administrator credential configured (--admin-token-file, --tls-admin-names): every change to groups, bindings and watches is refused")
	}
	if host, _, err := net.SplitHostPort(cfg.AdvertiseAddr); err == nil {
		if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
			log.Warn("--advertise-addr is not an address proxies can dial; followers will send it as the leader's", "advertise", cfg.AdvertiseAddr)
		}
	}
	unary, streamAuth := auth.Interceptors()
	// Keepalive pings find a vanished proxy's half-open connection, so
	// that its streams stop counting against its credential.
	gs := grpc.NewServer(grpc.Creds(creds), grpc.UnaryInterceptor(unary), grpc.StreamInterceptor(streamAuth),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}))
	srv.Register(gs)
	reflection.Register(gs)

	lis, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	statusLis, err := net.Listen("tcp", cfg.StatusAddr)
	if err != nil {
		lis.Close()
		return fmt.Errorf("status listen: %w", err)
	}
	mux, err := statusMux(srv, cli, reg, &consoleSource{srv: srv, name: cfg.Name, advertise: cfg.AdvertiseAddr})
	if err != nil {
		lis.Close()
		statusLis.Close()
		return err
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	log.Info("rgserver started", "version", versionString(), "addr", lis.Addr().String(),
		"status_addr", statusLis.Addr().String(), "advertise", cfg.AdvertiseAddr, "tls", cfg.TLSCert != "", "mtls", cfg.TLSCA != "",
		"auth", !auth.Open(), "budget_time_zone", cfg.budgetLoc.String(), "budget_day_length", cfg.BudgetDayLength.String())

	// Every part runs under one group: the first to fail stops the others
	// (as SIGTERM does), and run returns once all of them have stopped.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := hs.Serve(statusLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("status server: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		if err := gs.Serve(lis); err != nil {
			return fmt.Errorf("grpc server: %w", err)
		}
		return nil
	})
	rl.auth, rl.srv = auth, srv
	g.Go(func() error { reload.OnSignal(gctx, hup, rl.reload); return nil })
	g.Go(func() error {
		// Run returns after gctx ends, having persisted the buckets and
		// resigned; then the servers stop.
		runErr := srv.Run(gctx)
		cancel() // the other parts stop too, whatever ended Run
		log.Info("rgserver stopping")
		stopped := make(chan struct{})
		go func() { // waited for below, or ended by gs.Stop
			gs.GracefulStop()
			close(stopped)
		}()
		t := time.NewTimer(2 * time.Second)
		select {
		case <-stopped:
		case <-t.C:
			// Token streams are long-lived; do not wait for proxies to hang up.
			gs.Stop()
			<-stopped
		}
		t.Stop()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
		return runErr
	})
	return g.Wait()
}

// authenticator builds who may call rgserver from the token files and
// the certificate names.
func authenticator(cfg config) (*tokenserver.Authenticator, error) {
	ac, err := authConfig(cfg)
	if err != nil {
		return nil, err
	}
	return tokenserver.NewAuthenticator(ac)
}

// authConfig reads the token files of cfg (again, on a reload).
func authConfig(cfg config) (tokenserver.AuthConfig, error) {
	ac := tokenserver.AuthConfig{ClientCerts: cfg.TLSCA != "", TLSAdminNames: splitList(cfg.TLSAdminNames), TLSProxyMaxStreams: cfg.TLSProxyMaxStreams}
	if cfg.AdminTokenFile != "" {
		b, err := os.ReadFile(cfg.AdminTokenFile)
		if err != nil {
			return ac, fmt.Errorf("admin token: %w", err)
		}
		ac.AdminToken = strings.TrimSpace(string(b))
		if ac.AdminToken == "" {
			return ac, fmt.Errorf("admin token file %s is empty", cfg.AdminTokenFile)
		}
	}
	if cfg.ProxyTokenFile != "" {
		b, err := os.ReadFile(cfg.ProxyTokenFile)
		if err != nil {
			return ac, fmt.Errorf("proxy tokens: %w", err)
		}
		if ac.ProxyTokens, err = tokenserver.ParseProxyTokens(b); err != nil {
			return ac, fmt.Errorf("%s: %w", cfg.ProxyTokenFile, err)
		}
	}
	return ac, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// serverTLS builds the gRPC TLS config; with --tls-ca, clients must present
// a certificate signed by it. The certificate is rl's, which a reload
// may replace.
func serverTLS(cfg config, rl *reloader) (*tls.Config, error) {
	cert, err := reload.LoadCertificate(cfg.TLSCert, cfg.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	rl.cert.Store(&cert)
	tc := &tls.Config{GetCertificate: rl.getCertificate, MinVersion: tls.VersionTLS12}
	if cfg.TLSCA != "" {
		pem, err := os.ReadFile(cfg.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("tls ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls ca: no certificates in %s", cfg.TLSCA)
		}
		tc.ClientCAs = pool
		tc.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

// health is the JSON body of /healthz and /readyz, in etcd's style.
type health struct {
	Health string `json:"health"`
	Reason string `json:"reason,omitempty"`
	Leader string `json:"leader,omitempty"`
	// Etcd says why etcd refuses writes (NOSPACE, no quorum) while the
	// server still serves: the leader grants from memory, DDL fails.
	Etcd string `json:"etcd,omitempty"`
	// Insecure is "true" when no authentication is configured.
	Insecure string `json:"insecure,omitempty"`
}

func writeHealth(w http.ResponseWriter, h health) {
	w.Header().Set("Content-Type", "application/json")
	h.Health = "true"
	if h.Reason != "" {
		h.Health = "false"
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(h)
}

// statusMux serves /metrics, /healthz, /readyz and the console (its page
// at /, its JSON at /api/console, its charts' at /api/history); any other
// path is 404.
func statusMux(srv *tokenserver.Server, cli *clientv3.Client, reg *prometheus.Registry, console *consoleSource) (*http.ServeMux, error) {
	page, err := statuspage.NewConsole(consoleHTML)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", srv.MetricsHandler(reg))
	mux.Handle("GET /{$}", page)
	mux.HandleFunc("GET /api/console", console.serveJSON)
	mux.HandleFunc("GET /api/history", console.serveHistory)
	// /healthz: the process is up and etcd answers.
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		if _, err := cli.Get(ctx, "/rg/health"); err != nil {
			writeHealth(w, health{Reason: "etcd: " + err.Error(), Leader: srv.LeaderAddr()})
			return
		}
		writeHealth(w, health{Leader: srv.LeaderAddr()})
	})
	// /readyz: the leader, or a follower that knows the leader. Still
	// ready while etcd refuses writes (the leader grants from memory), with
	// "etcd" saying why: refusing traffic then would turn an etcd problem
	// into an outage.
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		h := health{Leader: srv.LeaderAddr(), Etcd: srv.EtcdProblem()}
		if srv.Insecure() {
			h.Insecure = "true"
		}
		if !srv.Ready() {
			h.Reason, h.Leader = "no leader known yet", ""
		}
		writeHealth(w, h)
	})
	return mux, nil
}
