package tokenclient

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/rgproxy/rgproxy/internal/textcut"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// Chargeback (docs/budgets.md, Chargeback): what a group's statements
// cost, split by the values of the SQLCommenter tags the proxy bills and
// by account. The policy's statement ledger attributes each statement's
// settled cost (Attribute) when it charges the group, so the parts add up
// to what the group's reports carry; they ride with the group's report
// (Consumption.chargeback), per key its top ChargebackTopN values by RU
// and one "other" entry, accounts likewise.

// Bounds of chargeback, this side (rgserver checks them again).
const (
	// ChargebackTopN is how many values of a key (and accounts) of a
	// group one report carries by name; the rest go in its "other" entry.
	ChargebackTopN = 32
	// chargebackHeld bounds the values of a key (and the accounts) of a
	// group held between two reports: a value beyond them goes straight
	// to "other", so hostile tag values cannot grow the proxy's memory.
	chargebackHeld = 256
	// ChargebackMaxKeys is the most tag keys billed.
	ChargebackMaxKeys = 8
	// ChargebackValueBytes bounds a tag key or value, ChargebackAccountBytes
	// an account (user@host): longer ones are cut.
	ChargebackValueBytes   = 64
	ChargebackAccountBytes = 160
)

// BilledTag is a tag of a statement whose key is billed.
type BilledTag struct {
	Key, Value string
}

// ChargebackValue is value as it is billed: cut to ChargebackValueBytes,
// and ok false (billed as "other") when it holds a control character or
// is not UTF-8. Only the first bytes are looked at.
func ChargebackValue(v string) (string, bool) {
	v = textcut.Prefix(v, ChargebackValueBytes)
	if !validChargebackText(v) {
		return "", false
	}
	return v, true
}

// ChargebackAccount is user@host as it is billed: cut to
// ChargebackAccountBytes, bytes that are not UTF-8 replaced.
func ChargebackAccount(user, host string) string {
	u := textcut.Prefix(user, ChargebackAccountBytes)
	return textcut.Valid(u+"@"+textcut.Prefix(host, ChargebackAccountBytes), ChargebackAccountBytes)
}

// validChargebackText: UTF-8 without control characters.
func validChargebackText(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f || r == '\uFFFD' {
			return false
		}
	}
	return true
}

// ValidChargebackKey checks a tag key an administrator names for billing.
func ValidChargebackKey(k string) error {
	if k == "" || len(k) > ChargebackValueBytes || !validChargebackText(k) || strings.ContainsAny(k, ",='") {
		return fmt.Errorf("chargeback tag key %q: want 1 to %d characters, none of them a control character, ',', '=' or '\\''", k, ChargebackValueBytes)
	}
	return nil
}

// chargeFig is what a tag value or an account spent.
type chargeFig struct {
	rru, wru, stmts float64
}

func (f *chargeFig) add(o chargeFig) {
	f.rru += o.rru
	f.wru += o.wru
	f.stmts += o.stmts
}

func (f chargeFig) ru() float64 { return f.rru + f.wru }

// chargeSet is what the values of one key (or the accounts) of a group
// spent since the last report: at most chargebackHeld by name, the rest
// in other.
type chargeSet struct {
	vals  map[string]*chargeFig
	other chargeFig
}

func (cs *chargeSet) add(v string, other bool, f chargeFig) {
	if !other {
		if p := cs.vals[v]; p != nil {
			p.add(f)
			return
		}
		if len(cs.vals) < chargebackHeld {
			if cs.vals == nil {
				cs.vals = map[string]*chargeFig{}
			}
			nf := f // only a new value allocates
			cs.vals[v] = &nf
			return
		}
	}
	cs.other.add(f)
}

func (cs *chargeSet) empty() bool {
	return len(cs.vals) == 0 && cs.other == (chargeFig{})
}

// entries appends the set's top ChargebackTopN values by RU (then by
// value) and its other entry (the rest), and empties the set; mk makes an
// entry of a value ("" and other for the rest).
func (cs *chargeSet) entries(out []*tokenpb.ChargebackEntry, mk func(v string, other bool) *tokenpb.ChargebackEntry) []*tokenpb.ChargebackEntry {
	type kv struct {
		v string
		f chargeFig
	}
	list := make([]kv, 0, len(cs.vals))
	for v, f := range cs.vals {
		list = append(list, kv{v, *f})
	}
	slices.SortFunc(list, func(a, b kv) int {
		if c := cmp.Compare(b.f.ru(), a.f.ru()); c != 0 {
			return c
		}
		return strings.Compare(a.v, b.v)
	})
	other := cs.other
	for i, x := range list {
		if i >= ChargebackTopN {
			other.add(x.f)
			continue
		}
		out = append(out, fill(mk(x.v, false), x.f))
	}
	if other != (chargeFig{}) {
		out = append(out, fill(mk("", true), other))
	}
	clear(cs.vals)
	cs.other = chargeFig{}
	return out
}

func fill(e *tokenpb.ChargebackEntry, f chargeFig) *tokenpb.ChargebackEntry {
	e.Rru, e.Wru, e.Statements = max(f.rru, 0), max(f.wru, 0), uint64(max(math.Round(f.stmts), 0))
	return e
}

// chargeAcc is a group's chargeback since its last report.
type chargeAcc struct {
	// tags by key: at most ChargebackMaxKeys keys (the billed ones).
	tags     map[string]*chargeSet
	accounts chargeSet
}

// add attributes f to tags and account.
func (a *chargeAcc) add(tags []BilledTag, account string, f chargeFig) {
	for _, t := range tags {
		cs := a.tags[t.Key]
		if cs == nil {
			if len(a.tags) >= ChargebackMaxKeys {
				continue
			}
			if a.tags == nil {
				a.tags = map[string]*chargeSet{}
			}
			cs = &chargeSet{}
			a.tags[t.Key] = cs
		}
		v, ok := ChargebackValue(t.Value)
		cs.add(v, !ok, f)
	}
	if account != "" {
		// Cut again: only ChargebackAccount's output is expected.
		account = textcut.Prefix(account, ChargebackAccountBytes)
		if !utf8.ValidString(account) {
			account = textcut.Valid(account, ChargebackAccountBytes)
		}
		a.accounts.add(account, false, f)
	}
}

func (a *chargeAcc) empty() bool {
	for _, cs := range a.tags {
		if !cs.empty() {
			return false
		}
	}
	return a.accounts.empty()
}

// take returns the report's entries and empties the accumulator.
func (a *chargeAcc) take() []*tokenpb.ChargebackEntry {
	var out []*tokenpb.ChargebackEntry
	keys := make([]string, 0, len(a.tags))
	for k := range a.tags {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		out = a.tags[k].entries(out, func(v string, other bool) *tokenpb.ChargebackEntry {
			return &tokenpb.ChargebackEntry{TagKey: k, TagValue: v, Other: other}
		})
	}
	out = a.accounts.entries(out, func(v string, other bool) *tokenpb.ChargebackEntry {
		return &tokenpb.ChargebackEntry{Account: v, Other: other}
	})
	return out
}

// restore puts back the entries of a report rgserver did not take.
func (a *chargeAcc) restore(entries []*tokenpb.ChargebackEntry) {
	for _, e := range entries {
		f := chargeFig{rru: e.GetRru(), wru: e.GetWru(), stmts: float64(e.GetStatements())}
		if e.GetTagKey() == "" {
			a.accounts.add(e.GetAccount(), e.GetOther(), f)
			continue
		}
		cs := a.tags[e.GetTagKey()]
		if cs == nil {
			if a.tags == nil {
				a.tags = map[string]*chargeSet{}
			}
			cs = &chargeSet{}
			a.tags[e.GetTagKey()] = cs
		}
		cs.add(e.GetTagValue(), e.GetOther(), f)
	}
}

// Attribute records that cons (a statement's settled cost, or a part of
// it charged late) of group was spent by tags (those of the billed keys,
// at most ChargebackMaxKeys) and account (user@host, from
// ChargebackAccount), for the group's next report. The caller charges the
// group cons itself (Charge, ChargePurse); it never blocks. A statement
// billed to its account alone whose session's purse p holds group's
// advance is kept in the purse, without the groups' lock, and recorded
// with the purse's spending (within purseSweep); p may be nil.
func (c *Client) Attribute(p *Purse, group string, tags []BilledTag, account string, cons ru.Consumption) {
	f := chargeFig{rru: cons.RRU, wru: cons.WRU, stmts: cons.Statements}
	if !(f.rru >= 0 && f.wru >= 0 && f.stmts >= 0) || math.IsInf(f.ru()+f.stmts, 0) || f == (chargeFig{}) {
		return
	}
	if p != nil && len(tags) == 0 && account != "" && p.bill(group, account, f) {
		return
	}
	group = resourcegroup.NormalizeName(group)
	now := c.clk.Now()
	c.groups.mu.Lock()
	defer c.groups.mu.Unlock()
	if !c.groups.servesLocked(group) {
		return
	}
	gs := c.groups.useLocked(group, now)
	gs.charge.add(tags, account, f)
}

// ChargebackRow is what one tag value or account of a group spent in one
// interval of the chargeback history.
type ChargebackRow struct {
	Group       string
	Start       time.Time
	Granularity time.Duration
	// TagKey and TagValue: a tag's; Account: an account's (by account).
	// Other: the values (accounts) beyond the top ones; TagValue
	// (Account) is then empty.
	TagKey, TagValue, Account string
	Other                     bool
	RRU, WRU                  float64
	Statements                uint64
}

// Chargeback asks rgserver's leader for the chargeback history req names
// (by account when accounts, else by tag), as UsageHistory does the
// usage history: rows of a group, granularity or time not asked for are
// dropped, figures that are not finite and non-negative are 0.
func (c *Client) Chargeback(ctx context.Context, req *tokenpb.UsageHistoryRequest, accounts bool) ([]ChargebackRow, bool, error) {
	if !req.GetAllGroups() && len(req.GetGroups()) > usageGroupsMax {
		return nil, false, fmt.Errorf("tokenclient: chargeback of %d groups: at most %d", len(req.GetGroups()), usageGroupsMax)
	}
	limit := int(req.GetLimit())
	if limit <= 0 || limit > UsageHistoryMaxRows {
		limit = UsageHistoryMaxRows
	}
	resp, err := askUsage(ctx, c, func(ctx context.Context, us tokenpb.UsageServiceClient) (*tokenpb.ChargebackResponse, error) {
		return us.Chargeback(ctx, &tokenpb.ChargebackRequest{Range: req, Accounts: accounts})
	})
	if err != nil {
		return nil, false, err
	}
	asked := askedGroups(req.GetAllGroups(), req.GetGroups())
	truncated := resp.GetTruncated()
	out := make([]ChargebackRow, 0, min(len(resp.GetRows()), limit))
	for _, row := range resp.GetRows() {
		r := row.GetUsage()
		g := r.GetResourceGroup()
		if asked != nil && !asked[g] {
			continue
		}
		gran := r.GetGranularityS()
		if (gran != 1 && gran != 60 && gran != 3600) || (req.GetGranularityS() != 0 && gran != req.GetGranularityS()) {
			continue
		}
		if at := r.GetStartUnixMs(); at < req.GetFromUnixMs() || (req.GetToUnixMs() > 0 && at >= req.GetToUnixMs()) {
			continue
		}
		if accounts != (row.GetTagKey() == "") {
			continue
		}
		if len(out) == limit {
			truncated = true
			break
		}
		out = append(out, ChargebackRow{Group: g, Start: time.UnixMilli(r.GetStartUnixMs()),
			Granularity: time.Duration(gran) * time.Second, TagKey: row.GetTagKey(), TagValue: row.GetTagValue(),
			Account: row.GetAccount(), Other: row.GetOther(), RRU: figure(r.GetRru()), WRU: figure(r.GetWru()),
			Statements: r.GetStatements()})
	}
	return out, truncated, nil
}
