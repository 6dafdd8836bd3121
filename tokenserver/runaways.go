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
//
// A proxy credential speaks only for itself (credentials.go): it records
// only as an instance bound to it, only events of groups that exist,
// within its event rate; and when a group's (or the history's) rows are
// full, the credential that holds the most of them gives up its oldest,
// so that a flood of one credential pushes out only its own rows.

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
	// runawayLookups is how many group names one RecordRunaways may
	// read from etcd when the allocator does not hold them.
	runawayLookups = 4
)

// runawayKey is what collapses events into one row.
type runawayKey struct {
	instance, group, digest, match, action, rule string
}

// runawayRow is one row of the history; its JSON form is stored in etcd.
type runawayRow struct {
	id      string
	key     runawayKey
	start   int64 // ms since the epoch
	last    int64
	repeats uint64
	sample  string
	masked  string // "" in rows an older proxy sent: readers mask sample
	account string
	// cred is the credential that recorded the row ("" for rows of an
	// older version, or with authentication off).
	cred      string
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
	Cred     string `json:"credential,omitempty"`
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
	// credRows and byCred index the rows by credential, in the group and
	// in all: the eviction's "who holds the most".
	credRows map[string]map[string]int      // group → credential → rows
	byCred   map[string]map[string]*idQueue // group → credential → ids
	credAll  map[string]int
	allCred  map[string]*idQueue
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
			Help: "Runaway history rows dropped: expired (older than --runaway-history-retention), group_limit (the group's 10,000 rows were full: the credential holding the most of them gave up its oldest), total_limit (the 100,000 rows were full, likewise); events refused as malformed or naming a group that does not exist (unknown_group).",
		}, []string{"reason"}),
	}
	for _, r := range []string{"expired", "group_limit", "total_limit", "malformed", "unknown_group"} {
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
	h.credRows = map[string]map[string]int{}
	h.byCred = map[string]map[string]*idQueue{}
	h.credAll = map[string]int{}
	h.allCred = map[string]*idQueue{}
	h.dirty = map[string]bool{}
	h.deleted = map[string]bool{}
	h.prefix, h.seq = prefix, 0
}

// add puts a row in the indexes, then drops rows beyond the bounds: the
// oldest of the credential that holds the most rows of the group (of the
// history). Called with mu held.
func (h *runawayHistory) add(r *runawayRow) {
	h.rows[r.id] = r
	if o := h.open[r.key]; o == nil || o.start <= r.start {
		h.open[r.key] = r
	}
	g := r.key.group
	h.groups[g]++
	q := h.byGroup[g]
	if q == nil {
		q = &idQueue{}
		h.byGroup[g] = q
	}
	q.push(r.id)
	h.all.push(r.id)
	if h.credRows[g] == nil {
		h.credRows[g], h.byCred[g] = map[string]int{}, map[string]*idQueue{}
	}
	h.credRows[g][r.cred]++
	cq := h.byCred[g][r.cred]
	if cq == nil {
		cq = &idQueue{}
		h.byCred[g][r.cred] = cq
	}
	cq.push(r.id)
	h.credAll[r.cred]++
	aq := h.allCred[r.cred]
	if aq == nil {
		aq = &idQueue{}
		h.allCred[r.cred] = aq
	}
	aq.push(r.id)
	for h.groups[g] > h.perGroup {
		c := most(h.credRows[g])
		if !h.dropOldest(h.byCred[g][c], "group_limit") {
			break
		}
	}
	for len(h.rows) > h.total {
		c := most(h.credAll)
		if !h.dropOldest(h.allCred[c], "total_limit") {
			break
		}
	}
}

// most is the credential with the most rows (the first by name of equals).
func most(counts map[string]int) string {
	best, n := "", -1
	for c, k := range counts {
		if k > n || k == n && c < best {
			best, n = c, k
		}
	}
	return best
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
	g := r.key.group
	if h.groups[g]--; h.groups[g] <= 0 {
		delete(h.groups, g)
		delete(h.byGroup, g)
	}
	if cr := h.credRows[g]; cr != nil {
		if cr[r.cred]--; cr[r.cred] <= 0 {
			delete(cr, r.cred)
			delete(h.byCred[g], r.cred)
		}
		if len(cr) == 0 {
			delete(h.credRows, g)
			delete(h.byCred, g)
		}
	}
	if h.credAll[r.cred]--; h.credAll[r.cred] <= 0 {
		delete(h.credAll, r.cred)
		delete(h.allCred, r.cred)
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

// record adds valid events of instance, recorded under credential cred,
// of the groups exists accepts; it returns how many it kept and how
// many named a group that does not exist.
func (h *runawayHistory) record(instance, cred string, events []*pb.RunawayEvent, exists func(string) bool, now time.Time) (kept, unknown uint32) {
	nowMs := now.UnixMilli()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, raw := range events {
		e, err := validEvent(raw)
		if err != nil {
			h.dropped.WithLabelValues("malformed").Inc()
			continue
		}
		if !exists(e.GetResourceGroup()) {
			h.dropped.WithLabelValues("unknown_group").Inc()
			unknown++
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
			sample: e.GetSampleSql(), masked: e.GetMaskedSql(), account: e.GetAccount(), cred: cred}
		h.dirty[r.id] = true
		h.add(r)
	}
	return kept, unknown
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
			Last: r.last, Repeats: r.repeats, Sample: r.sample, Masked: r.masked, Account: r.account, Cred: r.cred}})
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
				start: rec.Start, last: rec.Last, repeats: rec.Repeats, sample: rec.Sample, masked: rec.Masked, account: rec.Account, cred: rec.Cred, persisted: true})
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

// RecordRunaways implements tokenpb.RunawayServiceServer. The instance
// must be bound to the caller's credential (or free, and then it binds
// it: credBook.claimInstance); events beyond the credential's rate and
// events of groups that do not exist are not kept (Accepted says how
// many were), and counted in rgserver_credential_refused_total.
func (rs runawayService) RecordRunaways(ctx context.Context, req *pb.RecordRunawaysRequest) (*pb.RecordRunawaysResponse, error) {
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
	p := principalFrom(ctx)
	now := s.now()
	if err := s.creds.claimInstance(p, in, now); err != nil {
		s.creds.refuse(p, refusedInstance, 1)
		return nil, status.Error(codes.PermissionDenied, err.Error())
	}
	events := req.GetEvents()
	if n := s.creds.events(p, len(events), now); n < len(events) {
		events = events[:n]
	}
	// Which groups exist, read once (the history's lock is never held
	// with the allocator's).
	known := make(map[string]bool, 4)
	s.mu.Lock()
	for _, e := range events {
		g := resourcegroup.NormalizeName(e.GetResourceGroup())
		if _, ok := known[g]; !ok {
			known[g] = s.holdsLocked(g)
		}
	}
	s.mu.Unlock()
	// A group created a moment ago may not have reached the allocator
	// yet: etcd says, for a few names a call (the rest wait for the
	// settings feed; a name etcd does not hold is remembered as in
	// AcquireTokens).
	lookups := 0
	for g, ok := range known {
		if ok || s.misses.has(g, now) || lookups >= runawayLookups {
			continue
		}
		lookups++
		rctx, cancel := etcdCall(ctx)
		_, err := s.store.GetGroup(rctx, g)
		cancel()
		switch {
		case err == nil:
			known[g] = true
		case errors.Is(err, resourcegroup.ErrNotFound):
			s.misses.add(g, now)
		}
	}
	kept, unknown := s.runaways.record(in, p.Name, events, func(g string) bool { return known[g] }, now)
	s.creds.refuse(p, refusedUnknownGroup, float64(unknown))
	return &pb.RecordRunawaysResponse{Accepted: kept}, nil
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
