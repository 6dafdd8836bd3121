package tokenserver

import (
	"context"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rgproxy/rgproxy/internal/topn"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// Chargeback (docs/design.md §7.10, docs/budgets.md): the proxies split
// each group's report by SQLCommenter tag value and by account
// (Consumption.chargeback); the leader records those parts in the usage
// history as series of their own, so that they are spread over the same
// seconds as the group's figures, rolled up into minutes and hours,
// written to etcd, loaded by the next term and bounded in memory with the
// rest. A part's series is named after its group, kind, key and value,
// joined by NUL bytes (which no group name, key, value or account holds):
//
//	<group>\x00t\x00<key>\x00<value>   a tag value
//	<group>\x00a\x00<user@host>        an account
//
// with chargeOther as the value (account) of a key's (the accounts')
// "other" row. Cardinality is bounded per group, per key and per hour:
// the first chargebackTopN values (accounts) of an hour that come are
// named, later ones go to "other" — and the proxies send at most their
// own top values per report, by RU.

// Bounds of chargeback, this side (the proxy's are the same).
const (
	// chargebackTopN is how many values of a key (accounts) of a group one
	// hour names; the rest of the hour goes to "other".
	chargebackTopN = 32
	// chargebackMaxKeys bounds the tag keys of a group per hour.
	chargebackMaxKeys = 8
	// chargebackMaxEntries bounds the entries of one report: every key's
	// top values and other, and the accounts'.
	chargebackMaxEntries = (chargebackMaxKeys + 1) * (chargebackTopN + 1)
	// chargebackValueBytes bounds a key or a value, chargebackAccountBytes
	// an account.
	chargebackValueBytes   = 64
	chargebackAccountBytes = 160
	// chargeOther is the value (account) of an "other" series.
	chargeOther = "\x01"
)

// chargeName is the series name of a part of group's usage: a tag value
// (key != "") or an account.
func chargeName(group, key, value string, other bool) string {
	if other {
		value = chargeOther
	}
	if key == "" {
		return group + "\x00a\x00" + value
	}
	return group + "\x00t\x00" + key + "\x00" + value
}

// chargePart is a chargeback series name read back.
type chargePart struct {
	group, key, value string // key "" for an account, value the account
	other             bool
}

// parseChargeName reads a series name made by chargeName; ok is false
// for a group's own series.
func parseChargeName(name string) (chargePart, bool) {
	group, rest, ok := strings.Cut(name, "\x00")
	if !ok {
		return chargePart{}, false
	}
	var p chargePart
	p.group = group
	switch {
	case strings.HasPrefix(rest, "a\x00"):
		p.value = rest[2:]
	case strings.HasPrefix(rest, "t\x00"):
		k, v, ok := strings.Cut(rest[2:], "\x00")
		if !ok || k == "" {
			return chargePart{}, false
		}
		p.key, p.value = k, v
	default:
		return chargePart{}, false
	}
	if p.value == chargeOther {
		p.value, p.other = "", true
	}
	return p, true
}

// seriesGroup is the group a series belongs to: its name, or a
// chargeback series' group.
func seriesGroup(name string) string {
	g, _, _ := strings.Cut(name, "\x00")
	return g
}

// validChargeText: UTF-8 of at most n bytes without control characters.
func validChargeText(s string, n int) bool {
	if len(s) > n || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// validChargeEntry checks one entry from the network.
func validChargeEntry(e *pb.ChargebackEntry) bool {
	ok := func(v float64) bool { return v >= 0 && v <= maxReportRU }
	if !ok(e.GetRru()) || !ok(e.GetWru()) || float64(e.GetStatements()) > maxReportRU {
		return false
	}
	if e.GetTagKey() == "" {
		if e.GetTagValue() != "" {
			return false
		}
		if e.GetOther() {
			return e.GetAccount() == ""
		}
		return e.GetAccount() != "" && validChargeText(e.GetAccount(), chargebackAccountBytes)
	}
	if e.GetAccount() != "" || !validChargeText(e.GetTagKey(), chargebackValueBytes) ||
		strings.ContainsAny(e.GetTagKey(), ",='") {
		return false
	}
	if e.GetOther() {
		return e.GetTagValue() == ""
	}
	return validChargeText(e.GetTagValue(), chargebackValueBytes)
}

// chargeAdmit names, per group and key (or the accounts), the values
// (accounts) of the current hour: at most chargebackTopN each, and
// chargebackMaxKeys keys per group. Guarded by Server.mu.
type chargeAdmit struct {
	hour int64
	// sets by group + "\x00" + key ("" for the accounts); keys counts the
	// keys per group.
	sets map[string]map[string]struct{}
	keys map[string]int
}

// admit says whether value of group's key (an account: key "") is named
// this hour at now; keyOK false: the key itself is beyond the bound.
func (a *chargeAdmit) admit(group, key, value string, now time.Time) (named, keyOK bool) {
	if h := now.Unix() / 3600; h != a.hour || a.sets == nil {
		a.hour, a.sets, a.keys = h, map[string]map[string]struct{}{}, map[string]int{}
	}
	sk := group + "\x00" + key
	set := a.sets[sk]
	if set == nil {
		if key != "" {
			if a.keys[group] >= chargebackMaxKeys {
				return false, false
			}
			a.keys[group]++
		}
		set = map[string]struct{}{}
		a.sets[sk] = set
	}
	if _, ok := set[value]; ok {
		return true, true
	}
	if len(set) >= chargebackTopN {
		return false, true
	}
	set[value] = struct{}{}
	return true, true
}

// newChargeDropped is rgserver_chargeback_dropped_entries_total.
func newChargeDropped() prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{
		Name: "rgserver_chargeback_dropped_entries_total",
		Help: "Chargeback entries of the proxies' reports dropped: malformed (a key, value or account too long or not UTF-8, a figure not finite and non-negative), beyond the entries of one report (297) or beyond the tag keys of a group in an hour (8).",
	})
}

// reportChargeback records the chargeback of one report of group, after
// reportUsage recorded its figures u: each entry spread over the same
// seconds. When the credential book bounded the report's figures (u below
// what c says), its parts are scaled down alike. Called with s.mu held.
func (s *Server) reportChargeback(name string, u usageFigures, c *pb.Consumption, interval, idle time.Duration, now time.Time) {
	entries := c.GetChargeback()
	if len(entries) == 0 {
		return
	}
	dropped := 0
	if len(entries) > chargebackMaxEntries {
		dropped += len(entries) - chargebackMaxEntries
		entries = entries[:chargebackMaxEntries]
	}
	// The credential book's bound, per figure.
	scale := func(bounded, sent float64) float64 {
		if !(sent > bounded) {
			return 1
		}
		return bounded / sent
	}
	sr, sw, ss := scale(u[figRRU], c.GetRru()), scale(u[figWRU], c.GetWru()), scale(u[figStatements], float64(c.GetStatements()))
	for _, e := range entries {
		if !validChargeEntry(e) {
			dropped++
			continue
		}
		var f usageFigures
		f[figRRU], f[figWRU] = e.GetRru()*sr, e.GetWru()*sw
		f[figStatements] = math.Floor(float64(e.GetStatements()) * ss)
		other := e.GetOther()
		value := e.GetTagValue()
		if e.GetTagKey() == "" {
			value = e.GetAccount()
		}
		if !other {
			named, keyOK := s.chargeAdmit.admit(name, e.GetTagKey(), value, now)
			if !keyOK {
				dropped++
				continue
			}
			other = !named
		} else if _, keyOK := s.chargeAdmit.admit(name, e.GetTagKey(), chargeOther, now); !keyOK {
			dropped++
			continue
		}
		s.usage.addUntil(chargeName(name, e.GetTagKey(), value, other), f, interval-idle, now.Add(-idle), now)
	}
	if dropped > 0 {
		s.chargeDropped.Add(float64(dropped))
	}
}

// chargeRow is one chargeback answer row before it is a message.
type chargeRow struct {
	part chargePart
	p    usagePoint
}

// queryCharge returns the chargeback points (by account when accounts,
// else by tag) of tier k in [from, to) of the groups keep accepts (nil:
// all), newest first, then by group, key and value, at most limit, and
// whether more matched.
func (h *usageHistory) queryCharge(keep map[string]bool, accounts bool, k int, from, to int64, limit int) ([]chargeRow, bool) {
	newer := func(a, b chargeRow) bool {
		if a.p.idx != b.p.idx {
			return a.p.idx > b.p.idx
		}
		if a.part.group != b.part.group {
			return a.part.group < b.part.group
		}
		if a.part.key != b.part.key {
			return a.part.key < b.part.key
		}
		if a.part.other != b.part.other {
			return !a.part.other
		}
		return a.part.value < b.part.value
	}
	keeper := topn.New(limit, newer)
	matched := 0
	list := h.seriesList(false)
	list = slices.DeleteFunc(list, func(s *usageSeries) bool {
		p, ok := parseChargeName(s.group)
		return !ok || (keep != nil && !keep[p.group]) || accounts != (p.key == "")
	})
	h.walk(list, func(s *usageSeries) {
		part, _ := parseChargeName(s.group)
		s.tiers[k].eachPoint(from, to, func(p usagePoint) {
			matched++
			keeper.Offer(chargeRow{part: part, p: p})
		})
	})
	return keeper.Sorted(), matched > limit
}

// Chargeback implements tokenpb.UsageServiceServer: the chargeback
// history, answered as UsageHistory is.
func (us usageService) Chargeback(_ context.Context, req *pb.ChargebackRequest) (*pb.ChargebackResponse, error) {
	s := us.s
	if !s.IsLeader() {
		return &pb.ChargebackResponse{NotLeader: &pb.NotLeader{LeaderAddr: s.LeaderAddr()}}, nil
	}
	r, err := validateUsageRequest(req.GetRange(), s.now())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "malformed chargeback request: %v", err)
	}
	if err := s.usage.loadedErr(); err != nil {
		return nil, err
	}
	rows, truncated := s.usage.queryCharge(r.keep, req.GetAccounts(), r.tier, r.from, r.to, r.limit)
	out := make([]*pb.ChargebackRow, 0, len(rows))
	size := 0
	for _, row := range rows {
		m := &pb.ChargebackRow{Usage: rowToPB(usageRow{group: row.part.group, p: row.p}, r.tier),
			Other: row.part.other}
		if row.part.key == "" {
			m.Account = row.part.value
		} else {
			m.TagKey, m.TagValue = row.part.key, row.part.value
		}
		n := proto.Size(m) + 4
		if size+n > usageAnswerBytes {
			truncated = true
			break
		}
		size += n
		out = append(out, m)
	}
	return &pb.ChargebackResponse{Rows: out, Truncated: truncated}, nil
}
