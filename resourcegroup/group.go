// Package resourcegroup owns what a resource group is: its definition
// (name, RU_PER_SEC, PRIORITY, BURSTABLE, QUERY_LIMIT, MODE,
// MAX_CONCURRENCY, BUDGET and the budgets' windows, PARENT), its validation, user
// bindings, and the SQL statements that manage groups (parse, render, execute
// against a Store). It knows nothing of gRPC or sockets.
package resourcegroup

import (
	"fmt"
	"math"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Unlimited is the RUPerSec value of RU_PER_SEC = UNLIMITED.
const Unlimited uint64 = math.MaxUint64

// MaxDepth is the most levels of groups under the service limit: a
// group, its parent and its parent's parent (PARENT = g).
const MaxDepth = 3

// DefaultGroup is the name of the group that always exists.
const DefaultGroup = "default"

// MaxNameLength is the longest name of a new group, in bytes, as in TiDB
// (ValidateNewName). A name that refers to a group may have up to this many
// characters (ValidateName): the rule of earlier versions.
const MaxNameLength = 32

// Priority orders admission when a proxy's backend concurrency limit is reached.
type Priority uint8

// Priorities, lowest first. The zero value is Medium so that a zero Group is sane.
const (
	PriorityMedium Priority = iota
	PriorityLow
	PriorityHigh
)

// BurstMode says how far a group may run above RU_PER_SEC.
type BurstMode uint8

const (
	// BurstOff (the default): the global bucket holds at most 1 s of RU_PER_SEC.
	BurstOff BurstMode = iota
	// BurstModerated (bare BURSTABLE): the bucket holds up to 10 s of RU_PER_SEC.
	BurstModerated
	// BurstUnlimited: never throttled, only metered.
	BurstUnlimited
)

// CapacitySeconds is how many seconds of RU_PER_SEC a group's bucket holds
// in mode m: 1 with BURSTABLE OFF, 10 with MODERATED, +Inf with UNLIMITED.
func (m BurstMode) CapacitySeconds() float64 {
	switch m {
	case BurstModerated:
		return 10
	case BurstUnlimited:
		return math.Inf(1)
	}
	return 1
}

// Action is what a QUERY_LIMIT does to a runaway statement.
type Action uint8

const (
	ActionNone Action = iota
	ActionDryRun
	ActionCooldown
	ActionKill
	ActionSwitchGroup
)

// WatchType says which later statements a runaway watch matches.
type WatchType uint8

const (
	WatchNone WatchType = iota
	// WatchExact matches the same SQL text.
	WatchExact
	// WatchSimilar matches the same normalized digest (literals replaced).
	WatchSimilar
)

// Mode is how a group's limits apply (an rgproxy extension of TiDB's SQL).
type Mode uint8

const (
	// ModeEnforce throttles: statements wait for tokens and are refused
	// with 8252, as in TiDB. The default.
	ModeEnforce Mode = iota
	// ModeWarn meters and charges like ENFORCE but never makes a statement
	// wait or refuses it: where ENFORCE would have, it records what would
	// have happened (rgproxy_would_wait_total, rgproxy_would_throttle_total).
	ModeWarn
	// ModeOff meters and never throttles, like BURSTABLE=UNLIMITED, but
	// keeps RU_PER_SEC for the dashboards.
	ModeOff
)

// QueryLimit is a group's runaway-query rule. Exactly one of ExecElapsed and
// RU is set.
type QueryLimit struct {
	// ExecElapsed is the wall time a statement may run on the backend; 0 = unset.
	ExecElapsed time.Duration
	// RU is the RU a statement may consume; 0 = unset.
	RU uint64
	// Action is what happens when the limit is crossed.
	Action Action
	// SwitchGroup is the target group of ActionSwitchGroup (lower case).
	SwitchGroup string
	// Watch is the kind of watch added when the limit is crossed; WatchNone = no watch.
	Watch WatchType
	// WatchDuration is how long a watch entry lives; 0 = forever.
	WatchDuration time.Duration
}

// Group is a resource group's definition.
type Group struct {
	// Name is the group's name, always lower case (names are case-insensitive).
	Name string
	// RUPerSec is the group's fill rate in RU per second, or Unlimited.
	RUPerSec uint64
	// Priority orders admission under the proxy's backend concurrency limit.
	Priority Priority
	// Burst is the BURSTABLE mode.
	Burst BurstMode
	// QueryLimit is the runaway rule; nil = none.
	QueryLimit *QueryLimit
	// Mode is ENFORCE (the zero value), WARN or OFF.
	Mode Mode
	// MaxConcurrency caps the group's statements running on the backend
	// at once across all proxies (each proxy lets ceil(n ÷ proxies) run);
	// 0 = no cap.
	MaxConcurrency uint64
	// Budgets are the group's BUDGET clauses (budget.go): at most one per
	// period, in period order (HOUR first); nil = none.
	Budgets []Budget
	// Parent is the group whose RU_PER_SEC holds over this group and its
	// siblings together (PARENT = name, lower case); "" = none.
	Parent string
	// Background is BACKGROUND's UTILIZATION_LIMIT, in percent of the
	// service limit (1 to 100); 0 = a foreground group. Under a service
	// limit a background group gets its RU_PER_SEC first (its floor) and
	// beyond it only what the foreground leaves, up to this share of the
	// limit; without one it runs as any group.
	Background uint8
	// Version is the store's revision of this definition (etcd ModRevision);
	// 0 when not stored yet. It is not part of the definition's identity.
	Version int64
}

// Binding ties either an account or a tag to a group.
//
// An account binding (User, Host set) ties an account — user@host, as
// MySQL knows accounts: 'app'@'%' and 'app'@'10.%' are two accounts with
// two bindings — to a group; a session is bound by the account the backend
// matched at its login (CURRENT_USER()).
//
// A tag binding (TagKey set; User and Host empty) ties a SQLCommenter tag
// key='value' to a group: a statement carrying that tag runs in the group
// (CREATE RESOURCE GROUP BINDING FOR TAG).
//
// A digest binding (Digest set; the other keys empty) ties a statement
// shape — its digest as statements_summary's DIGEST column shows it — to a
// group (CREATE RESOURCE GROUP BINDING FOR DIGEST).
type Binding struct {
	// User is the account's user name.
	User string
	// Host is the account's host pattern ('%' when ALTER USER gives none),
	// lower case as MySQL stores it.
	Host string
	// TagKey and TagValue are a tag binding's tag, decoded (no URL
	// encoding) and matched exactly.
	TagKey, TagValue string
	// Digest is a digest binding's digest: 16 lower-case hex digits
	// (ValidateDigest).
	Digest string
	// Group is the bound group's name.
	Group string
}

// IsTag reports whether b is a tag binding.
func (b Binding) IsTag() bool { return b.TagKey != "" }

// IsDigest reports whether b is a digest binding.
func (b Binding) IsDigest() bool { return b.Digest != "" }

// IsAccount reports whether b is an account binding.
func (b Binding) IsAccount() bool { return !b.IsTag() && !b.IsDigest() }

// Account returns an account binding's key, AccountKey(User, Host).
func (b Binding) Account() string { return AccountKey(b.User, b.Host) }

// Tag returns a tag binding's key, TagBindingKey(TagKey, TagValue).
func (b Binding) Tag() string { return TagBindingKey(b.TagKey, b.TagValue) }

// SortBindings sorts bindings as Store.ListBindings returns them: account
// bindings by account, then tag bindings by key and value, then digest
// bindings by digest.
func SortBindings(bs []Binding) {
	kind := func(b Binding) int {
		switch {
		case b.IsDigest():
			return 2
		case b.IsTag():
			return 1
		}
		return 0
	}
	sort.Slice(bs, func(i, j int) bool {
		a, b := bs[i], bs[j]
		if ka, kb := kind(a), kind(b); ka != kb {
			return ka < kb
		}
		if a.IsDigest() {
			return a.Digest < b.Digest
		}
		if a.IsTag() {
			if a.TagKey != b.TagKey {
				return a.TagKey < b.TagKey
			}
			return a.TagValue < b.TagValue
		}
		return a.Account() < b.Account()
	})
}

// MaxTagLength bounds a bound tag's key and its value, in bytes.
const MaxTagLength = 256

// ValidateTag checks the tag of a tag binding: a key of 1 to MaxTagLength
// bytes and a value of at most MaxTagLength, both valid UTF-8 (they travel
// in protobuf strings and JSON). It is the rule for tags read or dropped;
// a new binding's tag also passes ValidateNewTag.
func ValidateTag(key, value string) error {
	switch {
	case key == "":
		return NewInvalid(msgInvalidTag + ": the tag key is empty")
	case len(key) > MaxTagLength || len(value) > MaxTagLength:
		return NewInvalid(fmt.Sprintf("%s: a tag key or value is longer than %d bytes", msgInvalidTag, MaxTagLength))
	case !utf8.ValidString(key) || !utf8.ValidString(value):
		return NewInvalid(msgInvalidTag + ": a tag key or value is not valid UTF-8")
	}
	return nil
}

// TagBindingKey is the key of the tag binding of key='value': both parts
// URL-encoded (query encoding, which also encodes '=' and '/') and joined
// by '=', so that any key and value round-trip through SplitTagBindingKey.
// rgserver keeps tag bindings under /rg/tags/<TagBindingKey>.
func TagBindingKey(key, value string) string {
	return url.QueryEscape(key) + "=" + url.QueryEscape(value)
}

// SplitTagBindingKey splits a key made by TagBindingKey.
func SplitTagBindingKey(k string) (key, value string, err error) {
	ek, ev, ok := strings.Cut(k, "=")
	if !ok {
		return "", "", fmt.Errorf("tag binding key %q: no '='", k)
	}
	if key, err = url.QueryUnescape(ek); err != nil {
		return "", "", fmt.Errorf("tag binding key %q: %w", k, err)
	}
	if value, err = url.QueryUnescape(ev); err != nil {
		return "", "", fmt.Errorf("tag binding key %q: %w", k, err)
	}
	return key, value, nil
}

// DigestLength is the length of a statement digest as statements_summary's
// DIGEST column shows it: the 64-bit FNV-1a hash of the digest text
// (sqlscan.DigestHash) in 16 hex digits.
const DigestLength = 16

// MaxDigestBindings is how many digest bindings a store keeps by default;
// rgserver's --max-digest-bindings changes it.
const MaxDigestBindings = 10000

// NormalizeDigest returns a digest in lower case, the form bindings are
// kept in; ValidateDigest checks it.
func NormalizeDigest(d string) string { return strings.ToLower(d) }

// ValidateDigest checks the digest of a digest binding: exactly
// DigestLength hex digits (either case), as statements_summary's DIGEST
// column shows it.
func ValidateDigest(d string) error {
	if len(d) != DigestLength {
		return NewInvalid(fmt.Sprintf("%s: the digest is %d bytes long; a digest is the %d hex digits of "+
			"information_schema.statements_summary's DIGEST column", msgInvalidDigest, len(d), DigestLength))
	}
	for i := 0; i < len(d); i++ {
		c := d[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return NewInvalid(fmt.Sprintf("%s: the digest holds %s at character %d; a digest is the %d hex digits of "+
				"information_schema.statements_summary's DIGEST column", msgInvalidDigest, describeByte(c), i+1, DigestLength))
		}
	}
	return nil
}

// ParseDigest returns the hash a valid digest (ValidateDigest) stands for.
func ParseDigest(d string) (uint64, error) {
	if err := ValidateDigest(d); err != nil {
		return 0, err
	}
	h, err := strconv.ParseUint(d, 16, 64)
	if err != nil {
		return 0, NewInvalid(msgInvalidDigest + ": " + err.Error())
	}
	return h, nil
}

// FormatDigest writes a digest hash as statements_summary's DIGEST
// column shows it.
func FormatDigest(h uint64) string { return fmt.Sprintf("%016x", h) }

// describeByte names a byte of a digest for an error message: the
// character when it is printable ASCII, else its value.
func describeByte(c byte) string {
	if c < utf8.RuneSelf {
		return describeRune(rune(c))
	}
	return fmt.Sprintf("the byte 0x%02X", c)
}

// NewTooManyDigestBindings is the ErrInvalid of a digest binding beyond
// the store's bound.
func NewTooManyDigestBindings(max int) *Error {
	return NewInvalid(fmt.Sprintf("%s: %d digests are bound already, the most rgserver keeps (--max-digest-bindings); "+
		"DROP RESOURCE GROUP BINDING FOR DIGEST removes one", msgInvalidDigest, max))
}

// AccountKey is the key of the account user@host: "user@host", host in
// lower case. A user name may itself hold '@': SplitAccount splits at the
// last one, which the host cannot hold.
func AccountKey(user, host string) string { return user + "@" + strings.ToLower(host) }

// SplitAccount splits an account key made by AccountKey.
func SplitAccount(key string) (user, host string) {
	i := strings.LastIndexByte(key, '@')
	if i < 0 {
		return key, "%"
	}
	return key[:i], key[i+1:]
}
