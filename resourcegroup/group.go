// Package resourcegroup owns what a resource group is: its definition
// (name, RU_PER_SEC, PRIORITY, BURSTABLE, QUERY_LIMIT), its validation, user
// bindings, and the SQL statements that manage groups (parse, render, execute
// against a Store). It knows nothing of gRPC or sockets.
package resourcegroup

import (
	"math"
	"strings"
	"time"
)

// Unlimited is the RUPerSec value of RU_PER_SEC = UNLIMITED.
const Unlimited uint64 = math.MaxUint64

// DefaultGroup is the name of the group that always exists.
const DefaultGroup = "default"

// MaxNameLength is the longest group name accepted, in characters.
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
	// Version is the store's revision of this definition (etcd ModRevision);
	// 0 when not stored yet. It is not part of the definition's identity.
	Version int64
}

// Binding ties an account — user@host, as MySQL knows accounts — to a
// group. 'app'@'%' and 'app'@'10.%' are two accounts with two bindings;
// a session is bound by the account the backend matched at its login
// (CURRENT_USER()).
type Binding struct {
	// User is the account's user name.
	User string
	// Host is the account's host pattern ('%' when ALTER USER gives none),
	// lower case as MySQL stores it.
	Host string
	// Group is the bound group's name.
	Group string
}

// Account returns the binding's account key, AccountKey(User, Host).
func (b Binding) Account() string { return AccountKey(b.User, b.Host) }

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
