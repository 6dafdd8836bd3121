package tokenserver

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pingcap/failpoint"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

// etcd key layout (docs/design.md §8.1).
const (
	keyRoot     = "/rg/"
	keySettings = "/rg/settings/"
	keyAccounts = "/rg/accounts/"
	// keyTags holds tag bindings, /rg/tags/<resourcegroup.TagBindingKey>.
	keyTags = "/rg/tags/"
	// keyDigests holds digest bindings, /rg/digests/<16 hex digits>.
	keyDigests = "/rg/digests/"
	keyStates  = "/rg/states/"
	// keyUsers is where bindings were kept per user name before they were
	// per account; a new leader moves what it finds there (migrateBindings).
	keyUsers    = "/rg/users/"
	keyElection = "/rg/election"
)

func settingsKey(name string) string { return keySettings + name }
func accountKey(user, host string) string {
	return keyAccounts + resourcegroup.AccountKey(user, host)
}
func stateKey(name string) string { return keyStates + name }
func tagKey(key, value string) string {
	return keyTags + resourcegroup.TagBindingKey(key, value)
}
func digestKey(digest string) string { return keyDigests + digest }

// groupRecord is a group as stored in etcd (JSON). It has its own shape so
// that renaming a Go field never breaks stored data.
type groupRecord struct {
	RUPerSec   uint64       `json:"ru_per_sec"`
	Unlimited  bool         `json:"unlimited,omitempty"`
	Priority   uint8        `json:"priority"`
	Burst      uint8        `json:"burst"`
	QueryLimit *limitRecord `json:"query_limit,omitempty"`
	// rgproxy's extensions (zero: ENFORCE, no cap).
	Mode           uint8  `json:"mode,omitempty"`
	MaxConcurrency uint64 `json:"max_concurrency,omitempty"`
	// Budgets in period order; absent = none (docs/budgets.md).
	Budgets []budgetRecord `json:"budgets,omitempty"`
	// Parent is PARENT's group; absent = none.
	Parent string `json:"parent,omitempty"`
	// Background is BACKGROUND's UTILIZATION_LIMIT; absent = foreground.
	Background uint8 `json:"background,omitempty"`
}

// budgetRecord is a resourcegroup.Budget; period and actions by name, as
// on the wire, so that the record reads without the enum's numbering.
type budgetRecord struct {
	RU       uint64          `json:"ru"`
	Period   string          `json:"period"`
	Triggers []triggerRecord `json:"triggers"`
}

type triggerRecord struct {
	Percent          uint32 `json:"percent"`
	Action           string `json:"action"`
	ThrottleRUPerSec uint64 `json:"throttle_ru_per_sec,omitempty"`
}

type limitRecord struct {
	ExecElapsedMs   int64  `json:"exec_elapsed_ms,omitempty"`
	RU              uint64 `json:"ru,omitempty"`
	Action          uint8  `json:"action"`
	SwitchGroup     string `json:"switch_group,omitempty"`
	Watch           uint8  `json:"watch,omitempty"`
	WatchDurationMs int64  `json:"watch_duration_ms,omitempty"`
}

type bindingRecord struct {
	Host  string `json:"host,omitempty"`
	Group string `json:"group"`
}

func encodeGroup(g resourcegroup.Group) ([]byte, error) {
	r := groupRecord{RUPerSec: g.RUPerSec, Priority: uint8(g.Priority), Burst: uint8(g.Burst),
		Mode: uint8(g.Mode), MaxConcurrency: g.MaxConcurrency, Parent: g.Parent, Background: g.Background}
	if g.RUPerSec == resourcegroup.Unlimited {
		r.RUPerSec, r.Unlimited = 0, true
	}
	if q := g.QueryLimit; q != nil {
		r.QueryLimit = &limitRecord{
			ExecElapsedMs: q.ExecElapsed.Milliseconds(), RU: q.RU, Action: uint8(q.Action),
			SwitchGroup: q.SwitchGroup, Watch: uint8(q.Watch), WatchDurationMs: q.WatchDuration.Milliseconds(),
		}
	}
	for _, b := range g.Budgets {
		br := budgetRecord{RU: b.RU, Period: b.Period.String(), Triggers: make([]triggerRecord, len(b.Triggers))}
		for i, t := range b.Triggers {
			br.Triggers[i] = triggerRecord{Percent: t.Percent, Action: t.Action.String(), ThrottleRUPerSec: t.ThrottleRUPerSec}
		}
		r.Budgets = append(r.Budgets, br)
	}
	return json.Marshal(r)
}

func decodeGroup(name string, data []byte, version int64) (resourcegroup.Group, error) {
	var r groupRecord
	if err := json.Unmarshal(data, &r); err != nil {
		return resourcegroup.Group{}, fmt.Errorf("%w: group %q: bad stored value: %w", ErrEtcd, name, err)
	}
	g := resourcegroup.Group{Name: name, RUPerSec: r.RUPerSec, Priority: resourcegroup.Priority(r.Priority),
		Burst: resourcegroup.BurstMode(r.Burst), Version: version,
		Mode: resourcegroup.Mode(r.Mode), MaxConcurrency: r.MaxConcurrency, Parent: r.Parent, Background: min(r.Background, 100)}
	if r.Unlimited {
		g.RUPerSec = resourcegroup.Unlimited
	}
	if q := r.QueryLimit; q != nil {
		g.QueryLimit = &resourcegroup.QueryLimit{
			ExecElapsed: time.Duration(q.ExecElapsedMs) * time.Millisecond, RU: q.RU,
			Action: resourcegroup.Action(q.Action), SwitchGroup: q.SwitchGroup,
			Watch: resourcegroup.WatchType(q.Watch), WatchDuration: time.Duration(q.WatchDurationMs) * time.Millisecond,
		}
	}
	for _, br := range r.Budgets {
		// A name this version does not know reads as the zero value:
		// the group still loads, and the next ALTER's validation says
		// what is wrong with it.
		period, _ := resourcegroup.ParseBudgetPeriod(br.Period)
		b := resourcegroup.Budget{Period: period, RU: br.RU}
		for _, t := range br.Triggers {
			action, _ := resourcegroup.ParseBudgetAction(t.Action)
			b.Triggers = append(b.Triggers, resourcegroup.BudgetTrigger{Percent: t.Percent, Action: action, ThrottleRUPerSec: t.ThrottleRUPerSec})
		}
		g.Budgets = append(g.Budgets, b)
	}
	return g, nil
}

// decodeBinding decodes the binding stored under /rg/accounts/<account>.
func decodeBinding(account string, data []byte) (resourcegroup.Binding, error) {
	var r bindingRecord
	if err := json.Unmarshal(data, &r); err != nil {
		return resourcegroup.Binding{}, fmt.Errorf("%w: binding %q: bad stored value: %w", ErrEtcd, account, err)
	}
	user, host := resourcegroup.SplitAccount(account)
	return resourcegroup.Binding{User: user, Host: host, Group: r.Group}, nil
}

// decodeTagBinding decodes the tag binding stored under /rg/tags/<tag>.
func decodeTagBinding(tag string, data []byte) (resourcegroup.Binding, error) {
	key, value, err := resourcegroup.SplitTagBindingKey(tag)
	if err != nil {
		return resourcegroup.Binding{}, fmt.Errorf("%w: bad tag binding key: %w", ErrEtcd, err)
	}
	var r bindingRecord
	if err := json.Unmarshal(data, &r); err != nil {
		return resourcegroup.Binding{}, fmt.Errorf("%w: tag binding %q: bad stored value: %w", ErrEtcd, tag, err)
	}
	return resourcegroup.Binding{TagKey: key, TagValue: value, Group: r.Group}, nil
}

// decodeDigestBinding decodes the digest binding stored under
// /rg/digests/<digest>.
func decodeDigestBinding(digest string, data []byte) (resourcegroup.Binding, error) {
	if err := resourcegroup.ValidateDigest(digest); err != nil {
		return resourcegroup.Binding{}, fmt.Errorf("%w: bad digest binding key %q: %w", ErrEtcd, digest, err)
	}
	var r bindingRecord
	if err := json.Unmarshal(data, &r); err != nil {
		return resourcegroup.Binding{}, fmt.Errorf("%w: digest binding %q: bad stored value: %w", ErrEtcd, digest, err)
	}
	return resourcegroup.Binding{Digest: resourcegroup.NormalizeDigest(digest), Group: r.Group}, nil
}

// EtcdStore is the resourcegroup.Store of rgserver: groups under
// /rg/settings/<name>, account bindings under /rg/accounts/<user@host>,
// tag bindings under /rg/tags/<key>=<value> (key and value
// query-escaped), digest bindings under /rg/digests/<digest>, JSON
// values. A
// group's Version is its key's ModRevision. Creates are guarded by
// CreateRevision = 0 and updates by ModRevision, so concurrent writers on
// any replica never overwrite each other silently.
type EtcdStore struct {
	cli *clientv3.Client
	// now is the clock of watch creation and expiry; nil = time.Now.
	now func() time.Time
	// maxDigests bounds the digest bindings (0 =
	// resourcegroup.MaxDigestBindings).
	maxDigests int
}

var _ resourcegroup.Store = (*EtcdStore)(nil)

// NewEtcdStore returns a store over cli.
func NewEtcdStore(cli *clientv3.Client) *EtcdStore { return &EtcdStore{cli: cli} }

// EnsureDefault creates the `default` group if it is not stored yet.
func (s *EtcdStore) EnsureDefault(ctx context.Context) error {
	val, err := encodeGroup(resourcegroup.DefaultGroupDefinition())
	if err != nil {
		return err
	}
	k := settingsKey(resourcegroup.DefaultGroup)
	_, err = s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(val))).Commit()
	if err != nil {
		return fmt.Errorf("%w: create default group: %w", ErrEtcd, err)
	}
	return nil
}

// CreateGroup implements resourcegroup.Store.
func (s *EtcdStore) CreateGroup(ctx context.Context, g resourcegroup.Group) error {
	_, err := s.createGroup(ctx, g)
	return err
}

func (s *EtcdStore) createGroup(ctx context.Context, g resourcegroup.Group) (resourcegroup.Group, error) {
	g.Name = resourcegroup.NormalizeName(g.Name)
	if err := g.ValidateNew(); err != nil {
		return g, err
	}
	val, err := encodeGroup(g)
	if err != nil {
		return g, err
	}
	k := settingsKey(g.Name)
	failpoint.Inject("etcdWriteError", func() {
		failpoint.Return(g, fmt.Errorf("%w: create group %q: %w", ErrEtcd, g.Name, errFailpoint))
	})
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(val))).Commit()
	if err != nil {
		return g, fmt.Errorf("%w: create group %q: %w", ErrEtcd, g.Name, err)
	}
	if !resp.Succeeded {
		return g, resourcegroup.NewExists(g.Name)
	}
	g.Version = resp.Header.Revision
	return g, nil
}

// AlterGroup implements resourcegroup.Store. With g.Version = 0 it replaces
// whatever is stored (retrying if it changes underneath).
func (s *EtcdStore) AlterGroup(ctx context.Context, g resourcegroup.Group) error {
	_, err := s.alterGroup(ctx, g)
	return err
}

func (s *EtcdStore) alterGroup(ctx context.Context, g resourcegroup.Group) (resourcegroup.Group, error) {
	g.Name = resourcegroup.NormalizeName(g.Name)
	if err := g.Validate(); err != nil {
		return g, err
	}
	val, err := encodeGroup(g)
	if err != nil {
		return g, err
	}
	k := settingsKey(g.Name)
	for {
		cur, err := s.GetGroup(ctx, g.Name)
		if err != nil {
			return g, err
		}
		if g.Version != 0 && g.Version != cur.Version {
			return g, resourcegroup.NewConflict(g.Name, g.Version, cur.Version)
		}
		failpoint.Inject("etcdWriteError", func() {
			failpoint.Return(g, fmt.Errorf("%w: alter group %q: %w", ErrEtcd, g.Name, errFailpoint))
		})
		expect := cur.Version
		failpoint.Inject("etcdTxnConflict", func() {
			// Another writer got in between our read and our write.
			expect--
		})
		resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", expect)).
			Then(clientv3.OpPut(k, string(val))).Commit()
		if err != nil {
			return g, fmt.Errorf("%w: alter group %q: %w", ErrEtcd, g.Name, err)
		}
		if resp.Succeeded {
			g.Version = resp.Header.Revision
			return g, nil
		}
		if g.Version != 0 {
			// Changed between our read and our write.
			latest, err := s.GetGroup(ctx, g.Name)
			if err != nil {
				return g, err
			}
			return g, resourcegroup.NewConflict(g.Name, g.Version, latest.Version)
		}
	}
}

// DropGroup implements resourcegroup.Store. The group's token state goes
// with it; bindings to it are kept (sessions fall back to `default`).
func (s *EtcdStore) DropGroup(ctx context.Context, name string) error {
	name = resourcegroup.NormalizeName(name)
	if name == resourcegroup.DefaultGroup {
		return resourcegroup.NewDropReserved()
	}
	if err := resourcegroup.ValidateName(name); err != nil {
		return err
	}
	k := settingsKey(name)
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), ">", 0)).
		Then(clientv3.OpDelete(k), clientv3.OpDelete(stateKey(name))).Commit()
	if err != nil {
		return fmt.Errorf("%w: drop group %q: %w", ErrEtcd, name, err)
	}
	if !resp.Succeeded {
		return resourcegroup.NewNotFound(name)
	}
	return nil
}

// GetGroup implements resourcegroup.Store.
func (s *EtcdStore) GetGroup(ctx context.Context, name string) (resourcegroup.Group, error) {
	name = resourcegroup.NormalizeName(name)
	if err := resourcegroup.ValidateName(name); err != nil {
		return resourcegroup.Group{}, err
	}
	failpoint.Inject("etcdReadError", func() {
		failpoint.Return(resourcegroup.Group{}, fmt.Errorf("%w: get group %q: %w", ErrEtcd, name, errFailpoint))
	})
	resp, err := s.cli.Get(ctx, settingsKey(name))
	if err != nil {
		return resourcegroup.Group{}, fmt.Errorf("%w: get group %q: %w", ErrEtcd, name, err)
	}
	if len(resp.Kvs) == 0 {
		if name == resourcegroup.DefaultGroup {
			return resourcegroup.DefaultGroupDefinition(), nil
		}
		return resourcegroup.Group{}, resourcegroup.NewNotFound(name)
	}
	kv := resp.Kvs[0]
	return decodeGroup(name, kv.Value, kv.ModRevision)
}

// ListGroups implements resourcegroup.Store.
func (s *EtcdStore) ListGroups(ctx context.Context) ([]resourcegroup.Group, error) {
	gs, _, err := s.listGroups(ctx, 0)
	return gs, err
}

// listGroups reads every group at revision rev (0 = latest) and returns the
// revision read.
func (s *EtcdStore) listGroups(ctx context.Context, rev int64) ([]resourcegroup.Group, int64, error) {
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	failpoint.Inject("etcdReadError", func() {
		failpoint.Return(nil, 0, fmt.Errorf("%w: list groups: %w", ErrEtcd, errFailpoint))
	})
	resp, err := s.cli.Get(ctx, keySettings, opts...)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: list groups: %w", ErrEtcd, err)
	}
	out := make([]resourcegroup.Group, 0, len(resp.Kvs)+1)
	hasDefault := false
	for _, kv := range resp.Kvs {
		name := strings.TrimPrefix(string(kv.Key), keySettings)
		g, err := decodeGroup(name, kv.Value, kv.ModRevision)
		if err != nil {
			return nil, 0, err
		}
		hasDefault = hasDefault || name == resourcegroup.DefaultGroup
		out = append(out, g)
	}
	if !hasDefault {
		out = append(out, resourcegroup.DefaultGroupDefinition())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, resp.Header.Revision, nil
}

// BindUser implements resourcegroup.Store. The group must exist when the
// binding is written (checked in the same transaction).
func (s *EtcdStore) BindUser(ctx context.Context, b resourcegroup.Binding) error {
	b.Group = resourcegroup.NormalizeName(b.Group)
	if b.IsDigest() {
		return s.bindDigest(ctx, b)
	}
	if b.IsTag() {
		return s.bindTag(ctx, b)
	}
	if b.User == "" {
		return resourcegroup.NewInvalid("invalid binding: empty user name")
	}
	if err := resourcegroup.ValidateName(b.Group); err != nil {
		return err
	}
	b.Host = strings.ToLower(b.Host)
	if b.Host == "" {
		b.Host = "%"
	}
	if b.Group == resourcegroup.DefaultGroup {
		return s.UnbindUser(ctx, b.User, b.Host)
	}
	val, err := json.Marshal(bindingRecord{Host: b.Host, Group: b.Group})
	if err != nil {
		return err
	}
	return s.putBinding(ctx, accountKey(b.User, b.Host), val, b.Group, "bind user "+strconv.Quote(b.User))
}

// putBinding writes a binding's value under k if its group exists
// (checked in the same transaction).
func (s *EtcdStore) putBinding(ctx context.Context, k string, val []byte, group, what string) error {
	gk := settingsKey(group)
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(gk), ">", 0)).
		Then(clientv3.OpPut(k, string(val))).Commit()
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrEtcd, what, err)
	}
	if !resp.Succeeded {
		return resourcegroup.NewNotFound(group)
	}
	return nil
}

// bindTag writes or, for `default`, removes a tag binding.
func (s *EtcdStore) bindTag(ctx context.Context, b resourcegroup.Binding) error {
	if err := resourcegroup.ValidateTag(b.TagKey, b.TagValue); err != nil {
		return err
	}
	if err := resourcegroup.ValidateName(b.Group); err != nil {
		return err
	}
	k := tagKey(b.TagKey, b.TagValue)
	if b.Group == resourcegroup.DefaultGroup {
		if _, err := s.cli.Delete(ctx, k); err != nil {
			return fmt.Errorf("%w: unbind tag %q: %w", ErrEtcd, b.TagKey, err)
		}
		return nil
	}
	if err := resourcegroup.ValidateNewTag(b.TagKey, b.TagValue); err != nil {
		return err
	}
	val, err := json.Marshal(bindingRecord{Group: b.Group})
	if err != nil {
		return err
	}
	return s.putBinding(ctx, k, val, b.Group, "bind tag "+strconv.Quote(b.TagKey))
}

// bindDigest writes or, for `default`, removes a digest binding. A new
// digest is refused once maxDigests are bound: the count is read first
// and the put is conditional on the digest's key being absent, so only
// creations racing on several replicas may pass the bound, each by one.
func (s *EtcdStore) bindDigest(ctx context.Context, b resourcegroup.Binding) error {
	if err := resourcegroup.ValidateDigest(b.Digest); err != nil {
		return err
	}
	if err := resourcegroup.ValidateName(b.Group); err != nil {
		return err
	}
	d := resourcegroup.NormalizeDigest(b.Digest)
	k := digestKey(d)
	if b.Group == resourcegroup.DefaultGroup {
		if _, err := s.cli.Delete(ctx, k); err != nil {
			return fmt.Errorf("%w: unbind digest %s: %w", ErrEtcd, d, err)
		}
		return nil
	}
	val, err := json.Marshal(bindingRecord{Group: b.Group})
	if err != nil {
		return err
	}
	what := "bind digest " + d
	// Replacing a bound digest's group takes no room.
	gk := settingsKey(b.Group)
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(gk), ">", 0), clientv3.Compare(clientv3.CreateRevision(k), ">", 0)).
		Then(clientv3.OpPut(k, string(val))).Else(clientv3.OpGet(gk, clientv3.WithCountOnly())).Commit()
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrEtcd, what, err)
	}
	if resp.Succeeded {
		return nil
	}
	if resp.Responses[0].GetResponseRange().Count == 0 {
		return resourcegroup.NewNotFound(b.Group)
	}
	limit := s.maxDigests
	if limit <= 0 {
		limit = resourcegroup.MaxDigestBindings
	}
	n, err := s.cli.Get(ctx, keyDigests, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrEtcd, what, err)
	}
	if n.Count >= int64(limit) {
		return resourcegroup.NewTooManyDigestBindings(limit)
	}
	return s.putBinding(ctx, k, val, b.Group, what)
}

// UnbindUser implements resourcegroup.Store.
func (s *EtcdStore) UnbindUser(ctx context.Context, user, host string) error {
	if user == "" {
		return resourcegroup.NewInvalid("invalid binding: empty user name")
	}
	if _, err := s.cli.Delete(ctx, accountKey(user, host)); err != nil {
		return fmt.Errorf("%w: unbind user %q: %w", ErrEtcd, user, err)
	}
	return nil
}

// GetBinding implements resourcegroup.Store.
func (s *EtcdStore) GetBinding(ctx context.Context, user, host string) (resourcegroup.Binding, error) {
	if user == "" {
		return resourcegroup.Binding{}, resourcegroup.NewInvalid("invalid binding: empty user name")
	}
	resp, err := s.cli.Get(ctx, accountKey(user, host))
	if err != nil {
		return resourcegroup.Binding{}, fmt.Errorf("%w: get binding %q: %w", ErrEtcd, user, err)
	}
	if len(resp.Kvs) == 0 {
		return resourcegroup.Binding{}, resourcegroup.NewNoBinding(user, host)
	}
	return decodeBinding(resourcegroup.AccountKey(user, host), resp.Kvs[0].Value)
}

// ListBindings implements resourcegroup.Store.
func (s *EtcdStore) ListBindings(ctx context.Context) ([]resourcegroup.Binding, error) {
	bs, _, err := s.listBindings(ctx, 0)
	return bs, err
}

// listBindings reads every account and tag binding at revision rev (0 =
// latest) and returns the revision read.
func (s *EtcdStore) listBindings(ctx context.Context, rev int64) ([]resourcegroup.Binding, int64, error) {
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	resp, err := s.cli.Get(ctx, keyAccounts, opts...)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: list bindings: %w", ErrEtcd, err)
	}
	if rev == 0 {
		// The header is the store's revision whatever was read; with
		// WithRev the read is at rev already.
		rev = resp.Header.Revision
	}
	// The tags at the same revision, so that the two make one snapshot.
	tags, err := s.cli.Get(ctx, keyTags, clientv3.WithPrefix(), clientv3.WithRev(rev))
	if err != nil {
		return nil, 0, fmt.Errorf("%w: list tag bindings: %w", ErrEtcd, err)
	}
	digests, err := s.cli.Get(ctx, keyDigests, clientv3.WithPrefix(), clientv3.WithRev(rev))
	if err != nil {
		return nil, 0, fmt.Errorf("%w: list digest bindings: %w", ErrEtcd, err)
	}
	out := make([]resourcegroup.Binding, 0, len(resp.Kvs)+len(tags.Kvs)+len(digests.Kvs))
	for _, kv := range resp.Kvs {
		b, err := decodeBinding(strings.TrimPrefix(string(kv.Key), keyAccounts), kv.Value)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, b)
	}
	for _, kv := range tags.Kvs {
		b, err := decodeTagBinding(strings.TrimPrefix(string(kv.Key), keyTags), kv.Value)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, b)
	}
	for _, kv := range digests.Kvs {
		b, err := decodeDigestBinding(strings.TrimPrefix(string(kv.Key), keyDigests), kv.Value)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, b)
	}
	resourcegroup.SortBindings(out)
	return out, rev, nil
}

// migrateBindings moves the bindings an earlier rgserver kept per user
// name (/rg/users/<user>, whose record held the host given in ALTER USER)
// to their account (/rg/accounts/<user>@<host>), each in one transaction
// fenced on the election key (key, rev): an old binding of 'app'@'%'
// becomes the binding of that account, as ALTER USER named it. A binding
// already present for the account wins. It returns how many moved.
func (s *EtcdStore) migrateBindings(ctx context.Context, key string, rev int64) (int, error) {
	resp, err := s.cli.Get(ctx, keyUsers, clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("%w: list old bindings: %w", ErrEtcd, err)
	}
	moved := 0
	for _, kv := range resp.Kvs {
		var r bindingRecord
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			return moved, fmt.Errorf("%w: old binding %q: bad stored value: %w", ErrEtcd, kv.Key, err)
		}
		host := r.Host
		if host == "" {
			host = "%"
		}
		user := strings.TrimPrefix(string(kv.Key), keyUsers)
		nk := accountKey(user, host)
		r.Host = strings.ToLower(host)
		val, err := json.Marshal(r)
		if err != nil {
			return moved, err
		}
		tr, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).
			Then(clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(nk), "=", 0)},
				[]clientv3.Op{clientv3.OpPut(nk, string(val))}, nil),
				clientv3.OpDelete(string(kv.Key))).Commit()
		if err != nil {
			return moved, fmt.Errorf("%w: migrate binding %q: %w", ErrEtcd, kv.Key, err)
		}
		if !tr.Succeeded {
			return moved, fmt.Errorf("migrate binding %q: %w", kv.Key, ErrNotLeader)
		}
		moved++
	}
	return moved, nil
}
