package resourcegroup

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

// Store holds group definitions and user bindings. tokenclient implements it
// over gRPC, rgserver over etcd, MemStore in memory. Names passed in are
// normalized by the implementation. The group `default` always exists.
type Store interface {
	// CreateGroup adds g; ErrExists if a group of that name exists.
	CreateGroup(ctx context.Context, g Group) error
	// AlterGroup replaces the definition of g.Name. If g.Version != 0 it must
	// equal the stored Version, else an error wrapping ErrConflict.
	// ErrNotFound if there is no such group.
	AlterGroup(ctx context.Context, g Group) error
	// DropGroup removes a group; ErrNotFound, and ErrInvalid for `default`.
	DropGroup(ctx context.Context, name string) error
	// GetGroup returns a group; ErrNotFound.
	GetGroup(ctx context.Context, name string) (Group, error)
	// ListGroups returns every group sorted by name.
	ListGroups(ctx context.Context) ([]Group, error)
	// BindUser binds the account b.User@b.Host, or for a tag binding
	// (b.IsTag()) the tag b.TagKey='b.TagValue', or for a digest binding
	// (b.IsDigest()) the statement shape b.Digest, to b.Group, which must
	// exist (ErrNotFound). Binding to `default` is unbinding. A new
	// digest binding beyond the store's bound is ErrInvalid
	// (NewTooManyDigestBindings).
	BindUser(ctx context.Context, b Binding) error
	// UnbindUser removes an account's binding; no error when there is none.
	UnbindUser(ctx context.Context, user, host string) error
	// GetBinding returns an account's binding; ErrNotFound when none.
	GetBinding(ctx context.Context, user, host string) (Binding, error)
	// ListBindings returns every binding, account, tag and digest
	// bindings, in SortBindings' order.
	ListBindings(ctx context.Context) ([]Binding, error)
}

// NewNoBinding is the ErrNotFound of Store.GetBinding.
func NewNoBinding(user, host string) *Error {
	return &Error{Code: CodeUnknown, State: "HY000",
		Message: fmt.Sprintf("account '%s'@'%s' has no resource group binding", user, host), Err: ErrNotFound}
}

// NewNoTagBinding is the ErrNotFound of dropping a tag binding that does
// not exist.
func NewNoTagBinding(key, value string) *Error {
	return &Error{Code: CodeUnknown, State: "HY000",
		Message: fmt.Sprintf("tag %s='%s' has no resource group binding", key, strings.ReplaceAll(value, "'", "''")), Err: ErrNotFound}
}

// NewNoDigestBinding is the ErrNotFound of dropping a digest binding that
// does not exist.
func NewNoDigestBinding(digest string) *Error {
	return &Error{Code: CodeUnknown, State: "HY000",
		Message: fmt.Sprintf("digest '%s' has no resource group binding", digest), Err: ErrNotFound}
}

// NewDropReserved is the ErrInvalid of dropping `default`.
func NewDropReserved() *Error { return NewInvalid(msgDropReserved) }

// MemStore is a goroutine-safe in-memory Store, for tests and for a single
// proxy without rgserver. Versions count up from 1 across all groups, like
// etcd revisions. Bindings to a dropped group are kept: sessions resolve a
// missing group to `default`.
type MemStore struct {
	mu       sync.Mutex
	rev      int64
	groups   map[string]Group
	bindings map[string]Binding
	// tags are the tag bindings by Binding.Tag(), digests the digest
	// bindings by digest; MaxDigests bounds digests (0 =
	// MaxDigestBindings).
	tags       map[string]Binding
	digests    map[string]Binding
	MaxDigests int
	// The runaway watch list (watchstore.go); now is its clock, nil =
	// time.Now.
	watches  map[uint64]Watch
	watchSeq uint64
	now      func() time.Time
	// serviceLimit is the service limit (servicelimit.go), set by SQL
	// when serviceLimitSet.
	serviceLimit    uint64
	serviceLimitSet bool
}

var _ Store = (*MemStore)(nil)

// NewMemStore returns a store holding only the `default` group.
func NewMemStore() *MemStore {
	s := &MemStore{groups: map[string]Group{}, bindings: map[string]Binding{}, tags: map[string]Binding{},
		digests: map[string]Binding{}}
	d := DefaultGroupDefinition()
	s.rev++
	d.Version = s.rev
	s.groups[d.Name] = d
	return s
}

// CreateGroup implements Store.
func (s *MemStore) CreateGroup(ctx context.Context, g Group) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("create resource group: %w", err)
	}
	g.Name = NormalizeName(g.Name)
	if err := g.ValidateNew(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.groups[g.Name]; ok {
		return NewExists(g.Name)
	}
	s.rev++
	g.Version = s.rev
	s.groups[g.Name] = cloneGroup(g)
	return nil
}

// AlterGroup implements Store.
func (s *MemStore) AlterGroup(ctx context.Context, g Group) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("alter resource group: %w", err)
	}
	g.Name = NormalizeName(g.Name)
	if err := g.Validate(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.groups[g.Name]
	if !ok {
		return NewNotFound(g.Name)
	}
	if g.Version != 0 && g.Version != old.Version {
		return NewConflict(g.Name, g.Version, old.Version)
	}
	s.rev++
	g.Version = s.rev
	s.groups[g.Name] = cloneGroup(g)
	return nil
}

// DropGroup implements Store.
func (s *MemStore) DropGroup(ctx context.Context, name string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("drop resource group: %w", err)
	}
	name = NormalizeName(name)
	if name == DefaultGroup {
		return NewDropReserved()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.groups[name]; !ok {
		return NewNotFound(name)
	}
	delete(s.groups, name)
	s.rev++
	return nil
}

// GetGroup implements Store.
func (s *MemStore) GetGroup(ctx context.Context, name string) (Group, error) {
	if err := ctx.Err(); err != nil {
		return Group{}, fmt.Errorf("get resource group: %w", err)
	}
	name = NormalizeName(name)
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.groups[name]
	if !ok {
		return Group{}, NewNotFound(name)
	}
	return cloneGroup(g), nil
}

// ListGroups implements Store.
func (s *MemStore) ListGroups(ctx context.Context) ([]Group, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list resource groups: %w", err)
	}
	s.mu.Lock()
	out := make([]Group, 0, len(s.groups))
	for _, g := range s.groups {
		out = append(out, cloneGroup(g))
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// BindUser implements Store.
func (s *MemStore) BindUser(ctx context.Context, b Binding) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("bind user: %w", err)
	}
	b.Group = NormalizeName(b.Group)
	switch {
	case b.IsDigest():
		if err := ValidateDigest(b.Digest); err != nil {
			return err
		}
		b.Digest = NormalizeDigest(b.Digest)
		b.User, b.Host, b.TagKey, b.TagValue = "", "", "", ""
	case b.IsTag():
		if err := ValidateTag(b.TagKey, b.TagValue); err != nil {
			return err
		}
		b.User, b.Host = "", ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.groups[b.Group]; !ok {
		return NewNotFound(b.Group)
	}
	if b.IsDigest() {
		if b.Group == DefaultGroup {
			delete(s.digests, b.Digest)
			return nil
		}
		limit := s.MaxDigests
		if limit <= 0 {
			limit = MaxDigestBindings
		}
		if _, ok := s.digests[b.Digest]; !ok && len(s.digests) >= limit {
			return NewTooManyDigestBindings(limit)
		}
		s.digests[b.Digest] = b
		return nil
	}
	if b.IsTag() {
		if b.Group == DefaultGroup {
			delete(s.tags, b.Tag())
		} else {
			s.tags[b.Tag()] = b
		}
		return nil
	}
	b.Host = strings.ToLower(b.Host)
	if b.Group == DefaultGroup {
		delete(s.bindings, b.Account())
		return nil
	}
	s.bindings[b.Account()] = b
	return nil
}

// UnbindUser implements Store.
func (s *MemStore) UnbindUser(ctx context.Context, user, host string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("unbind user: %w", err)
	}
	s.mu.Lock()
	delete(s.bindings, AccountKey(user, host))
	s.mu.Unlock()
	return nil
}

// GetBinding implements Store.
func (s *MemStore) GetBinding(ctx context.Context, user, host string) (Binding, error) {
	if err := ctx.Err(); err != nil {
		return Binding{}, fmt.Errorf("get binding: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.bindings[AccountKey(user, host)]
	if !ok {
		return Binding{}, NewNoBinding(user, host)
	}
	return b, nil
}

// ListBindings implements Store.
func (s *MemStore) ListBindings(ctx context.Context) ([]Binding, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list bindings: %w", err)
	}
	s.mu.Lock()
	out := make([]Binding, 0, len(s.bindings)+len(s.tags)+len(s.digests))
	for _, b := range s.bindings {
		out = append(out, b)
	}
	for _, b := range s.tags {
		out = append(out, b)
	}
	for _, b := range s.digests {
		out = append(out, b)
	}
	s.mu.Unlock()
	SortBindings(out)
	return out, nil
}

// cloneGroup copies g deeply, so callers never share a *QueryLimit or a
// budget's triggers with the store.
func cloneGroup(g Group) Group {
	if g.QueryLimit != nil {
		q := *g.QueryLimit
		g.QueryLimit = &q
	}
	g.Budgets = cloneBudgets(g.Budgets)
	return g
}

// Clone returns a deep copy of g.
func (g Group) Clone() Group { return cloneGroup(g) }
