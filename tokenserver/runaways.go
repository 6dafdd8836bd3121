package tokenserver

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rgproxy/rgproxy/internal/textcut"
	"github.com/rgproxy/rgproxy/resourcegroup"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// The runaway history (RunawayService, docs/design.md §7.9): proxies send
// the runaway events they see to the leader, which collapses the events
// of one (instance, group, digest, match type, action, rule) within
// runawayWindow of a row's start into that row, keeps rows for the
// retention (7 days by default) within runawayPerGroup rows per group and
// runawayTotal in all (the oldest go first), and saves changed rows to
// etcd under /rg-runaways/ (outside /rg/, which proxies watch) with the
// bucket states, fenced on its term. A new term reloads them.

// Bounds of the runaway history.
const (
	// runawayWindow: an event joins the row of its key started less than
	// this long before it; else it starts a new row.
	runawayWindow = 10 * time.Minute
	// runawayPerGroup and runawayTotal bound the rows kept.
	runawayPerGroup = 10_000
	runawayTotal    = 100_000
	// DefaultRunawayRetention is how long a row is kept after its last event.
	DefaultRunawayRetention = 7 * 24 * time.Hour
	// maxRunawayEvents bounds one RecordRunaways.
	maxRunawayEvents = 1000
	// maxRunawaySample, maxRunawayAccount and maxRunawayRule bound an
	// event's strings, in bytes: longer ones are cut (at a UTF-8 boundary).
	maxRunawaySample  = 1024
	maxRunawayAccount = 256
	maxRunawayRule    = 256
	maxRunawayAction  = 128
	// runawaySkew: an event time further than this from the leader's
	// clock is taken as the leader's now.
	runawaySkew = runawayWindow
	// runawayAnswerBytes bounds one ListRunaways answer (encoded rows).
	runawayAnswerBytes = 3 << 20
	// runawayPersistTxns bounds the transactions of one persistence round;
	// what is left waits for the next.
	runawayPersistTxns = 50
	// keyRunaways holds the rows, one key per row.
	keyRunaways = "/rg-runaways/"
	// runawayLoadPage is how many rows a new term reads per request.
	runawayLoadPage = 1000
)

// runawayKey is what collapses events into one row.
type runawayKey struct {
	instance, group, digest, match, action, rule string
}

// runawayRow is one row of the history; its JSON form is stored in etcd.
type runawayRow struct {
	id        string
	key       runawayKey
	start     int64 // ms since the epoch
	last      int64
	repeats   uint64
	sample    string
	masked    string // "" in rows an older proxy sent: readers mask sample
	account   string
	persisted bool // a key exists (or is being written) in etcd
}

type runawayRecord struct {
	Instance string `json:"instance"`
	Group    string `json:"group"`
	Digest   string `json:"digest"`
	Match    string `json:"match"`
	Action   string `json:"action"`
	Rule     string `json:"rule,omitempty"`
	Start    int64  `json:"start_unix_ms"`
	Last     int64  `json:"last_unix_ms"`
	Repeats  uint64 `json:"repeats"`
	Sample   string `json:"sample,omitempty"`
	Masked   string `json:"masked,omitempty"`
	Account  string `json:"account,omitempty"`
}

// idQueue is a FIFO of row ids in creation order; ids of rows dropped
// meanwhile are skipped when popped.
type idQueue struct {
	ids  []string
	head int
}

func (q *idQueue) push(id string) { q.ids = append(q.ids, id) }

func (q *idQueue) pop() (string, bool) {
	if q.head >= len(q.ids) {
		return "", false
	}
	id := q.ids[q.head]
	q.ids[q.head] = ""
	q.head++
	if q.head > 1024 && q.head*2 > len(q.ids) {
		q.ids = append([]string(nil), q.ids[q.head:]...)
		q.head = 0
	}
	return id, true
}

// runawayHistory is the leader's history.
type runawayHistory struct {
	retention       time.Duration
	perGroup, total int

	mu      sync.Mutex
	rows    map[string]*runawayRow
	open    map[runawayKey]*runawayRow // the newest row of each key
	groups  map[string]int             // rows per group
	byGroup map[string]*idQueue
	all     idQueue
	// prefix and seq make row ids: the term's election revision and a
	// counter, so ids of different terms never collide.
	prefix string
	seq    uint64
	// dirty rows are to be written, deleted keys to be removed.
	dirty   map[string]bool
	deleted map[string]bool

	dropped *prometheus.CounterVec
}

func newRunawayHistory(retention time.Duration) *runawayHistory {
	if retention <= 0 {
		retention = DefaultRunawayRetention
	}
	h := &runawayHistory{retention: retention, perGroup: runawayPerGroup, total: runawayTotal,
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rgserver_runaway_history_dropped_total",
			Help: "Runaway history rows dropped: expired (older than --runaway-history-retention), group_limit (the group's 10,000 rows were full), total_limit (the 100,000 rows were full); events refused as malformed.",
		}, []string{"reason"}),
	}
	for _, r := range []string{"expired", "group_limit", "total_limit", "malformed"} {
		h.dropped.WithLabelValues(r)
	}
	h.reset("0")
	return h
}

func (h *runawayHistory) register(r prometheus.Registerer) error {
	rows := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "rgserver_runaway_history_rows",
		Help: "Rows of the runaway history (information_schema.runaway_queries) this replica holds: on the leader, the cluster's.",
	}, func() float64 {
		h.mu.Lock()
		defer h.mu.Unlock()
		return float64(len(h.rows))
	})
	for _, c := range []prometheus.Collector{rows, h.dropped} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// reset empties the history for a term whose ids start with prefix.
// Called with mu held (or before use).
func (h *runawayHistory) reset(prefix string) {
	h.rows = map[string]*runawayRow{}
	h.open = map[runawayKey]*runawayRow{}
	h.groups = map[string]int{}
	h.byGroup = map[string]*idQueue{}
	h.all = idQueue{}
	h.dirty = map[string]bool{}
	h.deleted = map[string]bool{}
	h.prefix, h.seq = prefix, 0
}

// add puts a row in the indexes, then drops the oldest rows beyond the
// bounds. Called with mu held.
func (h *runawayHistory) add(r *runawayRow) {
	h.rows[r.id] = r
	if o := h.open[r.key]; o == nil || o.start <= r.start {
		h.open[r.key] = r
	}
	h.groups[r.key.group]++
	q := h.byGroup[r.key.group]
	if q == nil {
		q = &idQueue{}
		h.byGroup[r.key.group] = q
	}
	q.push(r.id)
	h.all.push(r.id)
	for h.groups[r.key.group] > h.perGroup {
		if !h.dropOldest(q, "group_limit") {
			break
		}
	}
	for len(h.rows) > h.total {
		if !h.dropOldest(&h.all, "total_limit") {
			break
		}
	}
}

// dropOldest removes the oldest live row of q.
func (h *runawayHistory) dropOldest(q *idQueue, reason string) bool {
	for {
		id, ok := q.pop()
		if !ok {
			return false
		}
		if r := h.rows[id]; r != nil {
			h.remove(r, reason)
			return true
		}
	}
}

// remove drops a row; its key goes from etcd at the next persistence.
func (h *runawayHistory) remove(r *runawayRow, reason string) {
	delete(h.rows, r.id)
	if h.open[r.key] == r {
		delete(h.open, r.key)
	}
	if h.groups[r.key.group]--; h.groups[r.key.group] <= 0 {
		delete(h.groups, r.key.group)
		delete(h.byGroup, r.key.group)
	}
	delete(h.dirty, r.id)
	if r.persisted {
		h.deleted[r.id] = true
	}
	h.dropped.WithLabelValues(reason).Inc()
}

// validEvent checks an event and returns it with its strings cut to
// their bounds.
func validEvent(e *pb.RunawayEvent) (*pb.RunawayEvent, error) {
	if err := resourcegroup.ValidateName(e.GetResourceGroup()); err != nil {
		return nil, err
	}
	if d := e.GetSqlDigest(); len(d) > 16 || !isHex(d) {
		return nil, fmt.Errorf("digest %q is not 16 hex digits", d)
	}
	switch e.GetMatchType() {
	case "IDENTIFY", "WATCH":
	default:
		return nil, fmt.Errorf("match type %q: want IDENTIFY or WATCH", textcut.Valid(e.GetMatchType(), 32))
	}
	if e.GetAction() == "" {
		return nil, errors.New("no action")
	}
	return &pb.RunawayEvent{
		ResourceGroup: resourcegroup.NormalizeName(e.GetResourceGroup()),
		TimeUnixMs:    e.GetTimeUnixMs(),
		Account:       textcut.Valid(e.GetAccount(), maxRunawayAccount),
		SqlDigest:     e.GetSqlDigest(),
		SampleSql:     textcut.Valid(e.GetSampleSql(), maxRunawaySample),
		MaskedSql:     textcut.Valid(e.GetMaskedSql(), maxRunawaySample),
		MatchType:     e.GetMatchType(),
		Action:        textcut.Valid(e.GetAction(), maxRunawayAction),
		Rule:          textcut.Valid(e.GetRule(), maxRunawayRule),
	}, nil
}

// record adds valid events of instance; it returns how many it kept.
func (h *runawayHistory) record(instance string, events []*pb.RunawayEvent, now time.Time) uint32 {
	nowMs := now.UnixMilli()
	var kept uint32
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, raw := range events {
		e, err := validEvent(raw)
		if err != nil {
			h.dropped.WithLabelValues("malformed").Inc()
			continue
		}
		t := e.GetTimeUnixMs()
		if t <= 0 || t > nowMs+runawaySkew.Milliseconds() || t < nowMs-runawaySkew.Milliseconds() {
			t = nowMs
		}
		kept++
		k := runawayKey{instance: instance, group: e.GetResourceGroup(), digest: e.GetSqlDigest(),
			match: e.GetMatchType(), action: e.GetAction(), rule: e.GetRule()}
		if r := h.open[k]; r != nil && t >= r.start && t-r.start < runawayWindow.Milliseconds() {
			r.repeats++
			r.last = max(r.last, t)
			h.dirty[r.id] = true
			continue
		}
		h.seq++
		r := &runawayRow{id: fmt.Sprintf("%s-%016x", h.prefix, h.seq), key: k, start: t, last: t, repeats: 1,
			sample: e.GetSampleSql(), masked: e.GetMaskedSql(), account: e.GetAccount()}
		h.dirty[r.id] = true
		h.add(r)
	}
	return kept
}

// expire drops the rows whose last event is older than the retention.
func (h *runawayHistory) expire(now time.Time) int {
	cutoff := now.Add(-h.retention).UnixMilli()
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, r := range h.rows {
		if r.last < cutoff {
			h.remove(r, "expired")
			n++
		}
	}
	return n
}

// list returns the rows of the groups keep accepts (nil: all), newest
// (by last event) first, at most limit and within the answer's bytes.
func (h *runawayHistory) list(keep map[string]bool, limit int) ([]*pb.RunawayRow, bool) {
	h.mu.Lock()
	rows := make([]*runawayRow, 0, len(h.rows))
	for _, r := range h.rows {
		if keep == nil || keep[r.key.group] {
			c := *r
			rows = append(rows, &c)
		}
	}
	h.mu.Unlock()
	slices.SortFunc(rows, func(a, b *runawayRow) int {
		return cmp.Or(cmp.Compare(b.last, a.last), cmp.Compare(b.id, a.id))
	})
	truncated := false
	if len(rows) > limit {
		rows, truncated = rows[:limit], true
	}
	out := make([]*pb.RunawayRow, 0, len(rows))
	size := 0
	for _, r := range rows {
		row := &pb.RunawayRow{Instance: r.key.instance, ResourceGroup: r.key.group, StartUnixMs: r.start,
			LastUnixMs: r.last, Repeats: r.repeats, MatchType: r.key.match, Action: r.key.action, Rule: r.key.rule,
			SqlDigest: r.key.digest, SampleSql: r.sample, MaskedSql: r.masked, Account: r.account}
		n := proto.Size(row) + 4
		if size+n > runawayAnswerBytes {
			truncated = true
			break
		}
		size += n
		out = append(out, row)
	}
	return out, truncated
}

// runawayOp is one row to write (rec != nil) or key to delete.
type runawayOp struct {
	id  string
	rec *runawayRecord
}

// takeOps takes at most n pending writes, deletions first, so that the
// keys in etcd stay within the bounds.
func (h *runawayHistory) takeOps(n int) []runawayOp {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ops []runawayOp
	for id := range h.deleted {
		if len(ops) >= n {
			return ops
		}
		delete(h.deleted, id)
		ops = append(ops, runawayOp{id: id})
	}
	for id := range h.dirty {
		if len(ops) >= n {
			return ops
		}
		delete(h.dirty, id)
		r := h.rows[id]
		if r == nil {
			continue
		}
		r.persisted = true
		ops = append(ops, runawayOp{id: id, rec: &runawayRecord{Instance: r.key.instance, Group: r.key.group,
			Digest: r.key.digest, Match: r.key.match, Action: r.key.action, Rule: r.key.rule, Start: r.start,
			Last: r.last, Repeats: r.repeats, Sample: r.sample, Masked: r.masked, Account: r.account}})
	}
	return ops
}

// giveBack marks ops that were not written as pending again.
func (h *runawayHistory) giveBack(ops []runawayOp) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, op := range ops {
		switch {
		case op.rec == nil:
			h.deleted[op.id] = true
		case h.rows[op.id] != nil:
			h.dirty[op.id] = true
		}
	}
}

// persistRunaways writes pending rows and deletions, fenced on the
// leader's election key, at most runawayPersistTxns transactions.
func (s *Server) persistRunaways(ctx context.Context) error {
	s.mu.Lock()
	key, rev := s.leaderKey, s.leaderRev
	s.mu.Unlock()
	if key == "" {
		return ErrNotLeader
	}
	h := s.runaways
	for range runawayPersistTxns {
		ops := h.takeOps(maxTxnOps - 1)
		if len(ops) == 0 {
			return nil
		}
		txn := make([]clientv3.Op, 0, len(ops))
		for _, op := range ops {
			if op.rec == nil {
				txn = append(txn, clientv3.OpDelete(keyRunaways+op.id))
				continue
			}
			val, err := json.Marshal(op.rec)
			if err != nil {
				h.giveBack(ops)
				return fmt.Errorf("tokenserver: encode runaway row: %w", err)
			}
			txn = append(txn, clientv3.OpPut(keyRunaways+op.id, string(val)))
		}
		resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).Then(txn...).Commit()
		if err != nil {
			h.giveBack(ops)
			return fmt.Errorf("%w: persist runaway history: %w", ErrEtcd, err)
		}
		if !resp.Succeeded {
			h.giveBack(ops)
			return ErrNotLeader
		}
	}
	return nil
}

// loadRunaways replaces the history with the rows stored in etcd, for a
// new term whose election revision is rev.
func (s *Server) loadRunaways(ctx context.Context, rev int64) error {
	h := s.runaways
	var rows []*runawayRow
	from := keyRunaways
	end := clientv3.GetPrefixRangeEnd(keyRunaways)
	for {
		resp, err := s.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(runawayLoadPage),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
		if err != nil {
			// Keep what this replica holds; new rows get the new term's ids.
			h.mu.Lock()
			h.prefix, h.seq = fmt.Sprintf("%016x", rev), 0
			h.mu.Unlock()
			return fmt.Errorf("%w: load runaway history: %w", ErrEtcd, err)
		}
		for _, kv := range resp.Kvs {
			var rec runawayRecord
			if err := json.Unmarshal(kv.Value, &rec); err != nil {
				s.log.Warn("bad runaway history row; skipped", "key", string(kv.Key), "err", err)
				continue
			}
			rows = append(rows, &runawayRow{id: strings.TrimPrefix(string(kv.Key), keyRunaways),
				key:   runawayKey{instance: rec.Instance, group: rec.Group, digest: rec.Digest, match: rec.Match, action: rec.Action, rule: rec.Rule},
				start: rec.Start, last: rec.Last, repeats: rec.Repeats, sample: rec.Sample, masked: rec.Masked, account: rec.Account, persisted: true})
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reset(fmt.Sprintf("%016x", rev))
	// Keys sort by creation (term, then counter): the queues come out
	// oldest first.
	for _, r := range rows {
		h.add(r)
	}
	return nil
}

// runawayService implements tokenpb.RunawayServiceServer over a Server.
type runawayService struct {
	pb.UnimplementedRunawayServiceServer
	s *Server
}

// RecordRunaways implements tokenpb.RunawayServiceServer.
func (rs runawayService) RecordRunaways(_ context.Context, req *pb.RecordRunawaysRequest) (*pb.RecordRunawaysResponse, error) {
	s := rs.s
	if !s.IsLeader() {
		return &pb.RecordRunawaysResponse{NotLeader: &pb.NotLeader{LeaderAddr: s.LeaderAddr()}}, nil
	}
	in := req.GetInstance()
	switch {
	case in == "" || len(in) > maxInstanceLen || !utf8.ValidString(in):
		return nil, status.Errorf(codes.InvalidArgument, "malformed runaway events: instance of %d bytes: want 1 to %d of UTF-8", len(in), maxInstanceLen)
	case len(req.GetEvents()) > maxRunawayEvents:
		return nil, status.Errorf(codes.InvalidArgument, "malformed runaway events: %d events, at most %d", len(req.GetEvents()), maxRunawayEvents)
	}
	return &pb.RecordRunawaysResponse{Accepted: s.runaways.record(in, req.GetEvents(), s.now())}, nil
}

// ListRunaways implements tokenpb.RunawayServiceServer.
func (rs runawayService) ListRunaways(_ context.Context, req *pb.ListRunawaysRequest) (*pb.ListRunawaysResponse, error) {
	s := rs.s
	if !s.IsLeader() {
		return &pb.ListRunawaysResponse{NotLeader: &pb.NotLeader{LeaderAddr: s.LeaderAddr()}}, nil
	}
	keep, err := validateClusterInspect(&pb.ClusterInspectRequest{Kind: pb.InspectKind_INSPECT_KIND_USAGE,
		AllGroups: req.GetAllGroups(), Groups: req.GetGroups()})
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "malformed runaway history request: %v", err)
	}
	if keep != nil {
		norm := make(map[string]bool, len(keep))
		for g := range keep {
			norm[resourcegroup.NormalizeName(g)] = true
		}
		keep = norm
	}
	limit := int(req.GetLimit())
	if limit <= 0 || limit > runawayTotal {
		limit = runawayTotal
	}
	rows, truncated := s.runaways.list(keep, limit)
	return &pb.ListRunawaysResponse{Rows: rows, Truncated: truncated}, nil
}
