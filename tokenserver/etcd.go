package tokenserver

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// ErrEtcd wraps failures to start or reach etcd.
var ErrEtcd = errors.New("tokenserver: etcd")

// EmbedConfig configures an etcd member embedded in rgserver.
type EmbedConfig struct {
	// Name is the member's name, unique in the cluster. Default "rgserver".
	Name string
	// DataDir holds the member's data. Required.
	DataDir string
	// PeerURL is where the member talks to its peers, e.g.
	// "http://10.0.0.1:2380". Default "http://127.0.0.1:0" (a free port; a
	// single-node cluster needs no fixed peer address).
	PeerURL string
	// InitialCluster lists every member as name=peerURL,...; default
	// Name=PeerURL (a single-node cluster).
	InitialCluster string
	// ClientURL is where the member serves its local clients. Default
	// "http://127.0.0.1:0" (a free loopback port).
	ClientURL string
	// StartTimeout bounds the wait for the member to join its cluster.
	// Default 60 s.
	StartTimeout time.Duration
	// HeartbeatInterval is raft's heartbeat (etcd's --heartbeat-interval).
	// Default 50 ms.
	HeartbeatInterval time.Duration
	// ElectionTimeout is raft's election timeout (etcd's --election-timeout).
	// Default 500 ms: when the rgserver that dies also held etcd's raft
	// leadership, raft must re-elect before the rgserver election's lease
	// can expire, and both must fit in about 5 s.
	ElectionTimeout time.Duration
	// CompactionRetention is how much history the member keeps: it
	// compacts periodically (etcd's auto-compaction-mode=periodic, as PD
	// configures its own), every retention up to once an hour, dropping
	// revisions older than it. Default 1 h.
	CompactionRetention time.Duration
	// QuotaBackendBytes is the database size at which etcd raises its
	// NOSPACE alarm and refuses writes. Default 8 GiB (PD's).
	QuotaBackendBytes int64
}

// Defaults of EmbedConfig.
const (
	DefaultCompactionRetention = time.Hour
	DefaultQuotaBackendBytes   = 8 << 30
)

// EmbeddedEtcd is a running embedded member.
type EmbeddedEtcd struct {
	etcd      *embed.Etcd
	closeOnce sync.Once
	// Endpoints are the member's client URLs, for clientv3.
	Endpoints []string
}

// StartEmbeddedEtcd starts a member and waits until it is ready (with a
// multi-member cluster, until a quorum has formed).
func StartEmbeddedEtcd(ctx context.Context, c EmbedConfig) (*EmbeddedEtcd, error) {
	if c.DataDir == "" {
		return nil, fmt.Errorf("%w: embedded etcd needs a data dir", ErrEtcd)
	}
	if c.Name == "" {
		c.Name = "rgserver"
	}
	if c.PeerURL == "" {
		c.PeerURL = "http://127.0.0.1:0"
	}
	if c.ClientURL == "" {
		c.ClientURL = "http://127.0.0.1:0"
	}
	if c.InitialCluster == "" {
		c.InitialCluster = c.Name + "=" + c.PeerURL
	}
	if c.StartTimeout <= 0 {
		c.StartTimeout = 60 * time.Second
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = 50 * time.Millisecond
	}
	if c.ElectionTimeout <= 0 {
		c.ElectionTimeout = 500 * time.Millisecond
	}
	if c.CompactionRetention <= 0 {
		c.CompactionRetention = DefaultCompactionRetention
	}
	if c.QuotaBackendBytes <= 0 {
		c.QuotaBackendBytes = DefaultQuotaBackendBytes
	}
	peer, err := url.Parse(c.PeerURL)
	if err != nil {
		return nil, fmt.Errorf("%w: peer url %q: %w", ErrEtcd, c.PeerURL, err)
	}
	client, err := url.Parse(c.ClientURL)
	if err != nil {
		return nil, fmt.Errorf("%w: client url %q: %w", ErrEtcd, c.ClientURL, err)
	}
	cfg := embed.NewConfig()
	cfg.Name = c.Name
	cfg.Dir = c.DataDir
	cfg.ListenPeerUrls = []url.URL{*peer}
	cfg.AdvertisePeerUrls = []url.URL{*peer}
	cfg.ListenClientUrls = []url.URL{*client}
	cfg.AdvertiseClientUrls = []url.URL{*client}
	cfg.InitialCluster = c.InitialCluster
	cfg.InitialClusterToken = "rgserver"
	cfg.TickMs = uint(c.HeartbeatInterval.Milliseconds())
	cfg.ElectionMs = uint(c.ElectionTimeout.Milliseconds())
	// Keep the database bounded: without compaction every revision stays.
	cfg.AutoCompactionMode = embed.CompactorModePeriodic
	cfg.AutoCompactionRetention = c.CompactionRetention.String()
	cfg.QuotaBackendBytes = c.QuotaBackendBytes
	// etcd's own logs are noisy; rgserver logs what matters through slog.
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: start embedded member: %w", ErrEtcd, err)
	}
	timer := time.NewTimer(c.StartTimeout)
	defer timer.Stop()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("%w: embedded member failed: %w", ErrEtcd, err)
	case <-timer.C:
		e.Close()
		return nil, fmt.Errorf("%w: embedded member not ready after %v", ErrEtcd, c.StartTimeout)
	case <-ctx.Done():
		e.Close()
		return nil, fmt.Errorf("%w: %w", ErrEtcd, ctx.Err())
	}
	ee := &EmbeddedEtcd{etcd: e}
	for _, l := range e.Clients {
		ee.Endpoints = append(ee.Endpoints, "http://"+l.Addr().String())
	}
	return ee, nil
}

// Err reports a fatal error of the running member.
func (e *EmbeddedEtcd) Err() <-chan error { return e.etcd.Err() }

// Close stops the member; calling it again does nothing.
func (e *EmbeddedEtcd) Close() { e.closeOnce.Do(e.etcd.Close) }

// NewEtcdClient returns rgserver's etcd client for endpoints. Its
// reconnect backoff is capped at a second (gRPC's own grows to two
// minutes): after an etcd outage the leader must reach etcd again before
// its lease, which etcd extends by one TTL when it comes back, expires.
func NewEtcdClient(endpoints []string) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		})},
	})
	if err != nil {
		return nil, fmt.Errorf("%w: client: %w", ErrEtcd, err)
	}
	return cli, nil
}
