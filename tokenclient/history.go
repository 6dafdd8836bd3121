package tokenclient

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rgproxy/rgproxy/internal/textcut"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// The runaway history (docs/design.md §7.9): the proxy queues each
// runaway event it sees and sends them in batches to rgserver's leader,
// which keeps them; ListRunaways reads the history back. Recording never
// blocks a statement: a full queue drops the event and counts it
// (rgproxy_runaway_events_dropped_total).

// Bounds of the runaway history, this side.
const (
	// runawayQueueLen is how many events wait to be sent.
	runawayQueueLen = 4096
	// runawayBatch is how many events one RecordRunaways carries (rgserver
	// takes at most 1,000).
	runawayBatch = 500
	// runawayLinger is how long the sender waits for more events before
	// it sends a batch.
	runawayLinger = 100 * time.Millisecond
	// runawaySendTimeout bounds one RecordRunaways.
	runawaySendTimeout = 2 * time.Second
	// listRunawaysTimeout bounds ListRunaways.
	listRunawaysTimeout = 3 * time.Second
	// runawaySample and runawayStringMax cut an event's strings, in bytes.
	runawaySample    = 1024
	runawayStringMax = 256
)

// RunawayEvent is one runaway statement this proxy saw.
type RunawayEvent struct {
	Group string
	Time  time.Time
	// Account is "user@host" (or "user" when the host is not known).
	Account string
	Digest  string
	// SampleSQL is the statement's text in UTF-8 (administrators and its
	// own account see it); MaskedSQL is its digest text read in its
	// session's mode (other accounts see it).
	SampleSQL, MaskedSQL string
	// MatchType is "IDENTIFY" (it crossed its QUERY_LIMIT) or "WATCH".
	MatchType string
	Action    string
	Rule      string
}

// RunawayRow is one row of the cluster's runaway history: the events of
// one instance, group, digest, match type, action and rule within ten
// minutes of Start.
type RunawayRow struct {
	Instance, Group string
	Start, Last     time.Time
	Repeats         uint64
	MatchType       string
	Action, Rule    string
	Digest          string
	// SampleSQL and MaskedSQL are the first event's (MaskedSQL is "" in
	// a row an older proxy or rgserver recorded).
	SampleSQL, MaskedSQL string
	Account              string
}

// runawaySender is the queue of events to send.
type runawaySender struct {
	queue chan *tokenpb.RunawayEvent
	mu    sync.Mutex
	// instance is what the history shows as INSTANCE; "" until
	// StartRunawayHistory.
	instance string
}

// RecordRunaway queues e for the history; it never blocks. Before
// StartRunawayHistory, or with the queue full, e is dropped and counted.
func (c *Client) RecordRunaway(e RunawayEvent) {
	ev := &tokenpb.RunawayEvent{ResourceGroup: e.Group, TimeUnixMs: e.Time.UnixMilli(),
		Account: textcut.Valid(e.Account, runawayStringMax), SqlDigest: e.Digest, SampleSql: textcut.Valid(e.SampleSQL, runawaySample),
		MaskedSql: textcut.Valid(e.MaskedSQL, runawaySample),
		MatchType: e.MatchType, Action: textcut.Valid(e.Action, runawayStringMax/2), Rule: textcut.Valid(e.Rule, runawayStringMax)}
	select {
	case c.runaways.queue <- ev:
	default:
		c.met.runawayDropped.Inc()
	}
}

// StartRunawayHistory sends the queued runaway events to rgserver's
// leader in the background, until Close, as instance (the proxy's MySQL
// address, at most 256 bytes). Call it once, after Start.
func (c *Client) StartRunawayHistory(instance string) error {
	if err := checkInstance("runaway history", instance); err != nil {
		return err
	}
	c.runaways.mu.Lock()
	started := c.runaways.instance != ""
	c.runaways.instance = instance
	c.runaways.mu.Unlock()
	if started {
		return errors.New("tokenclient: StartRunawayHistory called twice")
	}
	return c.startLoop("runaway history", func(ctx context.Context) { c.runawayLoop(ctx, instance) })
}

// runawayLoop sends batches until ctx ends; a batch rgserver did not
// take is sent again after a backoff (events meanwhile wait in the
// queue, or are dropped once it is full).
func (c *Client) runawayLoop(ctx context.Context, instance string) {
	var batch []*tokenpb.RunawayEvent
	attempt := 0
	for {
		if len(batch) == 0 {
			select {
			case e := <-c.runaways.queue:
				batch = append(batch, e)
			case <-ctx.Done():
				return
			}
		}
		linger := c.clk.NewTimer(runawayLinger)
	fill:
		for len(batch) < runawayBatch {
			select {
			case e := <-c.runaways.queue:
				batch = append(batch, e)
			case <-linger.C():
				break fill
			case <-ctx.Done():
				linger.Stop()
				return
			}
		}
		linger.Stop()
		err := c.sendRunaways(ctx, &tokenpb.RecordRunawaysRequest{Instance: instance, Events: batch})
		if err == nil {
			batch, attempt = batch[:0], 0
			continue
		}
		if st, ok := status.FromError(errors.Unwrap(err)); ok && st.Code() == codes.InvalidArgument {
			c.log.Warn("rgserver refused runaway events", "events", len(batch), "err", err)
			c.met.runawayDropped.Add(float64(len(batch)))
			batch = batch[:0]
			continue
		}
		attempt++
		d := backoff(attempt)
		c.log.Debug("sending runaway events failed; retrying", "events", len(batch), "err", err, "backoff", d.String())
		if c.sleep(ctx, d) != nil {
			return
		}
	}
}

// sendRunaways sends one batch to the leader.
func (c *Client) sendRunaways(ctx context.Context, req *tokenpb.RecordRunawaysRequest) error {
	ctx, cancel := context.WithTimeout(ctx, runawaySendTimeout)
	defer cancel()
	return c.atLeader(ctx, func(ctx context.Context, cl tokenpb.RunawayServiceClient) (*tokenpb.NotLeader, error) {
		resp, err := cl.RecordRunaways(ctx, req)
		return resp.GetNotLeader(), err
	})
}

// ListRunaways reads the cluster's runaway history, newest first: groups
// limits it to those groups (nil: every group; at most 1,000 names). An
// unreachable rgserver gives an error wrapping ErrUnavailable.
func (c *Client) ListRunaways(ctx context.Context, groups []string) ([]RunawayRow, error) {
	ctx, cancel := context.WithTimeout(ctx, listRunawaysTimeout)
	defer cancel()
	req := &tokenpb.ListRunawaysRequest{AllGroups: groups == nil, Groups: groups}
	var resp *tokenpb.ListRunawaysResponse
	err := c.atLeader(ctx, func(ctx context.Context, cl tokenpb.RunawayServiceClient) (*tokenpb.NotLeader, error) {
		r, err := cl.ListRunaways(ctx, req)
		resp = r
		return r.GetNotLeader(), err
	})
	if err != nil {
		return nil, err
	}
	out := make([]RunawayRow, 0, len(resp.GetRows()))
	for _, r := range resp.GetRows() {
		out = append(out, RunawayRow{Instance: r.GetInstance(), Group: r.GetResourceGroup(),
			Start: time.UnixMilli(r.GetStartUnixMs()), Last: time.UnixMilli(r.GetLastUnixMs()), Repeats: r.GetRepeats(),
			MatchType: r.GetMatchType(), Action: r.GetAction(), Rule: r.GetRule(), Digest: r.GetSqlDigest(),
			SampleSQL: r.GetSampleSql(), MaskedSQL: r.GetMaskedSql(), Account: r.GetAccount()})
	}
	return out, nil
}

// atLeader calls fn on the leader: the rgserver the Inspect stream is
// open to, else each of Servers in turn, following NOT_LEADER (at most 3
// hops). Unavailable, deadline and cancel errors wrap ErrUnavailable;
// others wrap the gRPC status.
func (c *Client) atLeader(ctx context.Context, fn func(context.Context, tokenpb.RunawayServiceClient) (*tokenpb.NotLeader, error)) error {
	return c.atLeaderConn(ctx, func(ctx context.Context, cc grpc.ClientConnInterface) (*tokenpb.NotLeader, error) {
		return fn(ctx, tokenpb.NewRunawayServiceClient(cc))
	})
}

// atLeaderConn is atLeader for any of rgserver's services: fn makes its
// client on the connection it is given.
func (c *Client) atLeaderConn(ctx context.Context, fn func(context.Context, grpc.ClientConnInterface) (*tokenpb.NotLeader, error)) error {
	addrs := c.cfg.Servers
	if l := c.insp.leader(); l != "" {
		addrs = append([]string{l}, addrs...)
	}
	var lastErr error
	for _, addr := range addrs {
		for hops := 0; ; hops++ {
			cc, err := c.conn(addr)
			if err != nil {
				lastErr = err
				break
			}
			nl, err := fn(ctx, cc)
			if err != nil {
				st := status.Convert(err)
				switch st.Code() {
				case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
					lastErr = fmt.Errorf("%w: rgserver %s: %s", ErrUnavailable, addr, st.Message())
				default:
					lastErr = fmt.Errorf("tokenclient: rgserver %s: %w", addr, err)
				}
				break
			}
			if nl != nil {
				lastErr = fmt.Errorf("%w: %s is not the leader", ErrUnavailable, addr)
				if nl.GetLeaderAddr() == "" || nl.GetLeaderAddr() == addr || hops >= 3 {
					break
				}
				addr = nl.GetLeaderAddr()
				continue
			}
			return nil
		}
		if !errors.Is(lastErr, ErrUnavailable) || ctx.Err() != nil {
			break
		}
	}
	return lastErr
}

func newRunawaySender() runawaySender {
	return runawaySender{queue: make(chan *tokenpb.RunawayEvent, runawayQueueLen)}
}
