package resourcegroup

import (
	"context"
	"errors"
	"fmt"
)

// Result is what an executed statement returns to the client: a result set
// when Columns is not nil, else OK with AffectedRows. Warnings become notes
// (SHOW WARNINGS), as TiDB reports IF [NOT] EXISTS no-ops.
type Result struct {
	Columns      []string
	Rows         [][]*string
	AffectedRows uint64
	Warnings     []*Error
}

// IsResultSet reports whether r is a result set rather than OK.
func (r *Result) IsResultSet() bool { return r.Columns != nil }

// alterRetries bounds how often ALTER re-reads a group that changed under it.
const alterRetries = 3

// NewSessionBound is returned by Execute for statements the proxy session
// runs itself (SET RESOURCE GROUP, CURRENT_RESOURCE_GROUP(), SHOW ... USAGE,
// SHOW LAST STATEMENT RU).
func NewSessionBound(st Statement) *Error {
	return &Error{Code: CodeUnknown, State: "HY000",
		Message: fmt.Sprintf("internal error: %T is executed by the proxy session", st), Err: ErrUnsupported}
}

// Execute runs a DDL, SHOW or SELECT admin statement against store. Access
// checks (RequiresSuper) are the caller's.
func Execute(ctx context.Context, st Statement, store Store) (*Result, error) {
	switch s := st.(type) {
	case *CreateGroup:
		return createGroup(ctx, s, store)
	case *AlterGroup:
		return alterGroup(ctx, s, store)
	case *DropGroup:
		if NormalizeName(s.Name) == DefaultGroup {
			return nil, NewDropReserved()
		}
		if err := checkNotSwitchTarget(ctx, NormalizeName(s.Name), store); err != nil {
			return nil, err
		}
		if err := checkNoChildren(ctx, NormalizeName(s.Name), store); err != nil {
			return nil, err
		}
		err := store.DropGroup(ctx, s.Name)
		if s.IfExists && errors.Is(err, ErrNotFound) {
			return &Result{Warnings: []*Error{NewNotFound(s.Name)}}, nil
		}
		if err != nil {
			return nil, err
		}
		return &Result{}, nil
	case *AlterUserGroup:
		return alterUser(ctx, s, store)
	case *CreateTagBinding:
		return createTagBinding(ctx, s, store)
	case *DropTagBinding:
		return dropTagBinding(ctx, s, store)
	case *CreateDigestBinding:
		return createDigestBinding(ctx, s, store)
	case *DropDigestBinding:
		return dropDigestBinding(ctx, s, store)
	case *ShowCreateGroup:
		g, err := store.GetGroup(ctx, s.Name)
		if err != nil {
			return nil, err
		}
		sql := g.SQL()
		name := g.Name
		return &Result{Columns: []string{"Resource_Group", "Create Resource Group"}, Rows: [][]*string{{&name, &sql}}}, nil
	case *SelectGroups:
		return selectGroups(ctx, s, store)
	case *QueryWatchAdd, *QueryWatchRemove, *SelectWatches:
		return executeWatch(ctx, st, store)
	case *AlterServiceLimit, *ShowResourceControl:
		return executeServiceLimit(ctx, st, store)
	case nil:
		return nil, fmt.Errorf("resourcegroup: execute: %w", ErrUnsupported)
	}
	return nil, NewSessionBound(st)
}

func createGroup(ctx context.Context, s *CreateGroup, store Store) (*Result, error) {
	g := s.Group.Clone()
	g.Name, g.Version = NormalizeName(g.Name), 0
	if err := g.ValidateNew(); err != nil {
		return nil, err
	}
	if err := checkSwitchTarget(ctx, g, store); err != nil {
		return nil, err
	}
	if g.Parent != "" {
		if err := checkTree(ctx, g, store); err != nil {
			return nil, err
		}
	}
	err := store.CreateGroup(ctx, g)
	if s.IfNotExists && errors.Is(err, ErrExists) {
		return &Result{Warnings: []*Error{NewExists(g.Name)}}, nil
	}
	if err != nil {
		return nil, err
	}
	return &Result{}, nil
}

// alterGroup applies an incremental change: read, apply, write back with
// the read Version, and start again if another writer got in between.
func alterGroup(ctx context.Context, s *AlterGroup, store Store) (*Result, error) {
	var err error
	for range alterRetries {
		var old Group
		old, err = store.GetGroup(ctx, s.Name)
		if s.IfExists && errors.Is(err, ErrNotFound) {
			return &Result{Warnings: []*Error{NewNotFound(s.Name)}}, nil
		}
		if err != nil {
			return nil, err
		}
		g := s.Apply(old)
		if err := g.Validate(); err != nil {
			return nil, err
		}
		if err := checkSwitchTarget(ctx, g, store); err != nil {
			return nil, err
		}
		if s.Fields&(FieldParent|FieldRUPerSec) != 0 {
			if err := checkTree(ctx, g, store); err != nil {
				return nil, err
			}
		}
		err = store.AlterGroup(ctx, g)
		if !errors.Is(err, ErrConflict) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	return &Result{}, nil
}

// checkNotSwitchTarget refuses to drop a group that another group's
// QUERY_LIMIT ... SWITCH_GROUP names: that rule would switch statements to
// nothing, and the other group's SHOW CREATE would no longer replay.
func checkNotSwitchTarget(ctx context.Context, name string, store Store) error {
	groups, err := store.ListGroups(ctx)
	if err != nil {
		return err
	}
	for _, g := range groups {
		if q := g.QueryLimit; q != nil && q.Action == ActionSwitchGroup && NormalizeName(q.SwitchGroup) == name && g.Name != name {
			return NewInvalid(fmt.Sprintf("%s: resource group '%s' is the SWITCH_GROUP target of resource group '%s'; "+
				"change or remove that QUERY_LIMIT first", msgDropSwitchTarget, name, g.Name))
		}
	}
	return nil
}

// checkSwitchTarget refuses SWITCH_GROUP to a group that does not exist.
func checkSwitchTarget(ctx context.Context, g Group, store Store) error {
	if g.QueryLimit == nil || g.QueryLimit.Action != ActionSwitchGroup {
		return nil
	}
	if _, err := store.GetGroup(ctx, g.QueryLimit.SwitchGroup); err != nil {
		return err
	}
	return nil
}

func alterUser(ctx context.Context, s *AlterUserGroup, store Store) (*Result, error) {
	group := NormalizeName(s.Group)
	if group == "" || group == DefaultGroup {
		if err := store.UnbindUser(ctx, s.User, s.Host); err != nil {
			return nil, err
		}
		return &Result{}, nil
	}
	if err := store.BindUser(ctx, Binding{User: s.User, Host: s.Host, Group: group}); err != nil {
		return nil, err
	}
	return &Result{}, nil
}

// createTagBinding binds a tag to an existing group, replacing the tag's
// binding if it has one. Storing a binding to `default` removes it, so
// binding a tag to `default` is refused rather than silently dropped: a
// tag bound to no group leaves statements to the account's binding, which
// is not `default`.
func createTagBinding(ctx context.Context, s *CreateTagBinding, store Store) (*Result, error) {
	if err := ValidateNewTag(s.Key, s.Value); err != nil {
		return nil, err
	}
	group := NormalizeName(s.Group)
	if group == DefaultGroup {
		return nil, NewInvalid(msgInvalidTag + ": a tag cannot be bound to resource group 'default'; " +
			"DROP RESOURCE GROUP BINDING FOR TAG removes a tag's binding")
	}
	if err := store.BindUser(ctx, Binding{TagKey: s.Key, TagValue: s.Value, Group: group}); err != nil {
		return nil, err
	}
	return &Result{}, nil
}

// dropTagBinding removes a tag's binding; a tag with none is an error, or
// a note with IF EXISTS. (Two DROPs racing may both succeed: a DDL
// statement, not a lock.)
func dropTagBinding(ctx context.Context, s *DropTagBinding, store Store) (*Result, error) {
	bs, err := store.ListBindings(ctx)
	if err != nil {
		return nil, err
	}
	found := false
	for _, b := range bs {
		if b.IsTag() && b.TagKey == s.Key && b.TagValue == s.Value {
			found = true
			break
		}
	}
	if !found {
		if s.IfExists {
			return &Result{Warnings: []*Error{NewNoTagBinding(s.Key, s.Value)}}, nil
		}
		return nil, NewNoTagBinding(s.Key, s.Value)
	}
	if err := store.BindUser(ctx, Binding{TagKey: s.Key, TagValue: s.Value, Group: DefaultGroup}); err != nil {
		return nil, err
	}
	return &Result{}, nil
}

// createDigestBinding binds a statement shape to an existing group,
// replacing the digest's binding if it has one; `default` is refused as
// for a tag (storing it would remove the binding).
func createDigestBinding(ctx context.Context, s *CreateDigestBinding, store Store) (*Result, error) {
	if err := ValidateDigest(s.Digest); err != nil {
		return nil, err
	}
	group := NormalizeName(s.Group)
	if group == DefaultGroup {
		return nil, NewInvalid(msgInvalidDigest + ": a digest cannot be bound to resource group 'default'; " +
			"DROP RESOURCE GROUP BINDING FOR DIGEST removes a digest's binding")
	}
	if err := store.BindUser(ctx, Binding{Digest: NormalizeDigest(s.Digest), Group: group}); err != nil {
		return nil, err
	}
	return &Result{}, nil
}

// dropDigestBinding removes a digest's binding; a digest with none is an
// error, or a note with IF EXISTS.
func dropDigestBinding(ctx context.Context, s *DropDigestBinding, store Store) (*Result, error) {
	if err := ValidateDigest(s.Digest); err != nil {
		return nil, err
	}
	d := NormalizeDigest(s.Digest)
	bs, err := store.ListBindings(ctx)
	if err != nil {
		return nil, err
	}
	found := false
	for _, b := range bs {
		if b.IsDigest() && b.Digest == d {
			found = true
			break
		}
	}
	if !found {
		if s.IfExists {
			return &Result{Warnings: []*Error{NewNoDigestBinding(d)}}, nil
		}
		return nil, NewNoDigestBinding(d)
	}
	if err := store.BindUser(ctx, Binding{Digest: d, Group: DefaultGroup}); err != nil {
		return nil, err
	}
	return &Result{}, nil
}

func selectGroups(ctx context.Context, s *SelectGroups, store Store) (*Result, error) {
	var groups []Group
	if s.HasWhere {
		g, err := store.GetGroup(ctx, s.Name)
		switch {
		case errors.Is(err, ErrNotFound):
		case err != nil:
			return nil, err
		default:
			groups = []Group{g}
		}
	} else {
		var err error
		if groups, err = store.ListGroups(ctx); err != nil {
			return nil, err
		}
	}
	cols := s.Columns
	if len(cols) == 0 {
		cols = InfoSchemaColumns()
	}
	idx := make([]int, len(cols))
	for i, c := range cols {
		idx[i] = -1
		for j, name := range infoSchemaColumns {
			if eqFold(c, name) {
				idx[i] = j
			}
		}
		if idx[i] < 0 {
			return nil, NewUnsupported("column " + c + " of information_schema.resource_groups")
		}
	}
	res := &Result{Columns: append([]string(nil), cols...), Rows: make([][]*string, 0, len(groups))}
	for _, g := range groups {
		full := InfoSchemaRow(g)
		row := make([]*string, len(idx))
		for i, j := range idx {
			row[i] = full[j]
		}
		res.Rows = append(res.Rows, row)
	}
	return res, nil
}
