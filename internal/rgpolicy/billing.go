package rgpolicy

import (
	"fmt"
	"net"
	"strings"

	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/sqlscan"
	"github.com/rgproxy/rgproxy/tokenclient"
)

// Chargeback (docs/budgets.md, Chargeback): every statement's cost is
// attributed, as the ledger charges it to a group, to the statement's
// values of the billed SQLCommenter tag keys (--chargeback-tag-keys) and
// to its account, through tokenclient.Client.Attribute, which sends the
// sums with the group's report. Because the ledger attributes exactly
// what it charges (settle, late), a group's by-tag and by-account sums
// add up to its total.

// billing is what a statement is billed to besides its groups.
type billing struct {
	// tags are the statement's billed tags, in the order of the keys;
	// allocated per statement (a late charge may still read them).
	tags []tokenclient.BilledTag
	// account is user@host.
	account string
}

// ParseChargebackKeys reads --chargeback-tag-keys: comma-separated keys,
// at most tokenclient.ChargebackMaxKeys, each valid
// (tokenclient.ValidChargebackKey); spaces around them are dropped,
// duplicates refused.
func ParseChargebackKeys(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var keys []string
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		if err := tokenclient.ValidChargebackKey(k); err != nil {
			return nil, err
		}
		for _, o := range keys {
			if o == k {
				return nil, fmt.Errorf("chargeback tag key %q named twice", k)
			}
		}
		keys = append(keys, k)
	}
	if len(keys) > tokenclient.ChargebackMaxKeys {
		return nil, fmt.Errorf("%d chargeback tag keys: at most %d", len(keys), tokenclient.ChargebackMaxKeys)
	}
	return keys, nil
}

// clientHost is addr's host (addr's string when it has no port).
func clientHost(addr net.Addr) string {
	if addr == nil {
		return ""
	}
	h, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	return h
}

// bill sets the statement's billing: its values of the billed keys (the
// trailing comment's, then the leading one's; a key's first value wins)
// and the session's account.
func (s *session) bill(sc *sqlscan.Scan, set *Settings) {
	s.cur.bill = billing{account: s.billedAccount()}
	keys := set.ChargebackTagKeys
	if len(keys) == 0 || sc.TrailingComment == "" && sc.LeadingComment == "" {
		return
	}
	var tags []tokenclient.BilledTag
	match := func(key, value string) bool {
		for _, k := range keys {
			if k != key {
				continue
			}
			for _, t := range tags {
				if t.Key == k {
					return true // a key's first value wins
				}
			}
			// Cut and copied: the statement's text is not kept alive by
			// a late charge.
			v, ok := tokenclient.ChargebackValue(value)
			if !ok {
				v = "\x00" // billed as "other" (Attribute checks again)
			}
			tags = append(tags, tokenclient.BilledTag{Key: k, Value: strings.Clone(v)})
		}
		return len(tags) < len(keys)
	}
	for _, c := range [2]string{sc.TrailingComment, sc.LeadingComment} {
		if c != "" && len(tags) < len(keys) {
			sqlscan.ParseTags(c, match)
		}
	}
	s.cur.bill.tags = tags
}

// billedAccount is the session's account as it is billed: user@host, the
// host being the host pattern of the account the backend matched at login
// when the session learned it (some account of the user name is bound, or
// the runaway history needed it), else the client's address: billing asks
// the backend nothing more.
func (s *session) billedAccount() string {
	host := s.clientHost
	if s.hostKnown {
		host = s.host
	}
	if s.acctUser != s.user || s.acctHost != host || s.acct == "" {
		s.acctUser, s.acctHost = s.user, host
		s.acct = tokenclient.ChargebackAccount(s.user, host)
	}
	return s.acct
}

// attribute records that group was charged cons for a statement billed
// to b.
func (lg *stmtLedger) attribute(group string, b *billing, cons ru.Consumption) {
	if b.account == "" && len(b.tags) == 0 {
		return
	}
	lg.p.tokens.Attribute(lg.purse, group, b.tags, b.account, cons)
}
