package tokenclient

import (
	"context"
	"fmt"
	"sort"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Store returns the resourcegroup.Store of admin statements: writes go to
// rgserver's ResourceGroupService (any replica) and then wait, at most 1 s,
// until the settings cache shows them, so a read through this proxy sees its
// own write; reads come from the settings cache. gRPC errors map back to
// resourcegroup's errors (rpcerror.go): AlreadyExists → ErrExists,
// NotFound → ErrNotFound, InvalidArgument and FailedPrecondition →
// ErrInvalid (with the server's message), Aborted → ErrConflict; anything
// else is a 1105 that names the rgserver and says why (unreachable, a
// refused credential and which flag to check, ...) and whether the
// statement was applied; an unreachable rgserver's wraps ErrUnavailable.
// The value also implements
// resourcegroup.WatchStore (runaway.go), the same way.
func (c *Client) Store() resourcegroup.Store { return rpcStore{c} }

type rpcStore struct{ c *Client }

var _ resourcegroup.Store = rpcStore{}

// call runs f against the servers in turn, starting with the one that
// answered last, until one is reachable. Its error is an *rpcFailure
// naming the servers tried (mapError reads them).
func (c *Client) call(ctx context.Context, f func(context.Context, tokenpb.ResourceGroupServiceClient) error) error {
	ctx = context.WithValue(ctx, adminCall{}, true) // bearerCreds sends the admin token
	start := c.conns.next()
	var err error
	var tried []string
	for i := range c.cfg.Servers {
		idx := (start + i) % len(c.cfg.Servers)
		addr := c.cfg.Servers[idx]
		tried = append(tried, addr)
		cc, cerr := c.conn(addr)
		if cerr != nil {
			err = cerr
			continue
		}
		err = f(ctx, tokenpb.NewResourceGroupServiceClient(cc))
		if status.Code(err) != codes.Unavailable {
			c.conns.answered(idx)
			if err != nil {
				return &rpcFailure{addrs: tried[len(tried)-1:], err: err}
			}
			return nil
		}
	}
	if err == nil {
		return nil
	}
	return &rpcFailure{addrs: tried, err: err}
}

// waitCache waits until ok holds on the cache, at most syncWait or until
// ctx ends; a write is done either way, so the wait's end is not an error.
func (c *Client) waitCache(ctx context.Context, ok func(snapshot) bool) {
	t := c.clk.NewTimer(syncWait)
	defer t.Stop()
	for {
		done, ch := c.cache.check(ok)
		if done {
			return
		}
		select {
		case <-ch:
		case <-t.C():
			c.log.Warn("the settings cache has not caught up with a write after 1s")
			return
		case <-ctx.Done():
			return
		}
	}
}

// atVersion: the cache holds group name at version v or later.
func atVersion(name string, v int64) func(snapshot) bool {
	return func(s snapshot) bool {
		g, ok := s.Groups[name]
		return s.Revision >= v || (ok && g.Version >= v)
	}
}

func (s rpcStore) CreateGroup(ctx context.Context, g resourcegroup.Group) error {
	g.Name = resourcegroup.NormalizeName(g.Name)
	var resp *tokenpb.CreateGroupResponse
	err := s.c.call(ctx, func(ctx context.Context, cl tokenpb.ResourceGroupServiceClient) (err error) {
		resp, err = cl.CreateGroup(ctx, &tokenpb.CreateGroupRequest{Group: tokenpb.GroupToPB(g)})
		return err
	})
	if err != nil {
		return mapError("create resource group", g.Name, err)
	}
	s.c.waitCache(ctx, atVersion(g.Name, resp.GetGroup().GetVersion()))
	return nil
}

func (s rpcStore) AlterGroup(ctx context.Context, g resourcegroup.Group) error {
	g.Name = resourcegroup.NormalizeName(g.Name)
	var resp *tokenpb.AlterGroupResponse
	err := s.c.call(ctx, func(ctx context.Context, cl tokenpb.ResourceGroupServiceClient) (err error) {
		resp, err = cl.AlterGroup(ctx, &tokenpb.AlterGroupRequest{Group: tokenpb.GroupToPB(g)})
		return err
	})
	if err != nil {
		return mapError("alter resource group", g.Name, err)
	}
	s.c.waitCache(ctx, atVersion(g.Name, resp.GetGroup().GetVersion()))
	return nil
}

func (s rpcStore) DropGroup(ctx context.Context, name string) error {
	name = resourcegroup.NormalizeName(name)
	err := s.c.call(ctx, func(ctx context.Context, cl tokenpb.ResourceGroupServiceClient) error {
		_, err := cl.DropGroup(ctx, &tokenpb.DropGroupRequest{Name: name})
		return err
	})
	if err != nil {
		return mapError("drop resource group", name, err)
	}
	s.c.waitCache(ctx, func(s snapshot) bool { _, ok := s.Groups[name]; return !ok })
	return nil
}

// GetGroup reads the settings cache.
func (s rpcStore) GetGroup(ctx context.Context, name string) (resourcegroup.Group, error) {
	if err := ctx.Err(); err != nil {
		return resourcegroup.Group{}, fmt.Errorf("get resource group: %w", err)
	}
	g, ok := s.c.Group(name)
	if !ok {
		return resourcegroup.Group{}, resourcegroup.NewNotFound(resourcegroup.NormalizeName(name))
	}
	return g, nil
}

// ListGroups reads the settings cache.
func (s rpcStore) ListGroups(ctx context.Context) ([]resourcegroup.Group, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list resource groups: %w", err)
	}
	var out []resourcegroup.Group
	var hasDefault bool
	s.c.cache.read(func(snap *snapshot) {
		out = make([]resourcegroup.Group, 0, len(snap.Groups)+1)
		for _, g := range snap.Groups {
			out = append(out, g.Clone())
		}
		_, hasDefault = snap.Groups[resourcegroup.DefaultGroup]
	})
	if !hasDefault {
		out = append(out, resourcegroup.DefaultGroupDefinition())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (s rpcStore) BindUser(ctx context.Context, b resourcegroup.Binding) error {
	b.Group = resourcegroup.NormalizeName(b.Group)
	err := s.c.call(ctx, func(ctx context.Context, cl tokenpb.ResourceGroupServiceClient) error {
		_, err := cl.BindUser(ctx, &tokenpb.BindUserRequest{Binding: tokenpb.BindingToPB(b)})
		return err
	})
	if err != nil {
		return mapError("bind user", b.Group, err)
	}
	s.c.waitCache(ctx, func(s snapshot) bool {
		cur, ok := s.Bindings[b.Account()]
		switch {
		case b.IsDigest():
			cur, ok = s.Digests[resourcegroup.NormalizeDigest(b.Digest)]
		case b.IsTag():
			cur, ok = s.Tags[b.Tag()]
		}
		if b.Group == resourcegroup.DefaultGroup {
			return !ok || cur.Group == b.Group
		}
		return ok && cur.Group == b.Group
	})
	return nil
}

func (s rpcStore) UnbindUser(ctx context.Context, user, host string) error {
	err := s.c.call(ctx, func(ctx context.Context, cl tokenpb.ResourceGroupServiceClient) error {
		_, err := cl.UnbindUser(ctx, &tokenpb.UnbindUserRequest{User: user, Host: host})
		return err
	})
	if err != nil {
		return mapError("unbind user", user, err)
	}
	k := resourcegroup.AccountKey(user, host)
	s.c.waitCache(ctx, func(s snapshot) bool { _, ok := s.Bindings[k]; return !ok })
	return nil
}

// GetBinding reads the settings cache.
func (s rpcStore) GetBinding(ctx context.Context, user, host string) (resourcegroup.Binding, error) {
	if err := ctx.Err(); err != nil {
		return resourcegroup.Binding{}, fmt.Errorf("get binding: %w", err)
	}
	b, ok := s.c.Binding(user, host)
	if !ok {
		return resourcegroup.Binding{}, resourcegroup.NewNoBinding(user, host)
	}
	return b, nil
}

// ListBindings reads the settings cache.
func (s rpcStore) ListBindings(ctx context.Context) ([]resourcegroup.Binding, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list bindings: %w", err)
	}
	var out []resourcegroup.Binding
	s.c.cache.read(func(snap *snapshot) {
		out = make([]resourcegroup.Binding, 0, len(snap.Bindings)+len(snap.Tags)+len(snap.Digests))
		for _, b := range snap.Bindings {
			out = append(out, b)
		}
		for _, b := range snap.Tags {
			out = append(out, b)
		}
		for _, b := range snap.Digests {
			out = append(out, b)
		}
	})
	resourcegroup.SortBindings(out)
	return out, nil
}

var _ resourcegroup.ServiceLimitStore = rpcStore{}

// ServiceLimit asks rgserver (any replica) for the service limit in force
// and what its leader last shared of it.
func (s rpcStore) ServiceLimit(ctx context.Context) (resourcegroup.ServiceLimit, error) {
	var resp *tokenpb.GetServiceLimitResponse
	err := s.c.call(ctx, func(ctx context.Context, cl tokenpb.ResourceGroupServiceClient) error {
		var err error
		resp, err = cl.GetServiceLimit(ctx, &tokenpb.GetServiceLimitRequest{})
		return err
	})
	if err != nil {
		return resourcegroup.ServiceLimit{}, mapError("show resource control", "", err)
	}
	return resourcegroup.ServiceLimit{RUPerSec: resp.GetRuPerSec(), FromFlag: resp.GetFromFlag(), RUPerSecSum: resp.GetRuPerSecSum(),
		Groups: int(resp.GetGroups()), Demand: resp.GetDemandRuPerSec(), Allocated: resp.GetAllocatedRuPerSec()}, nil
}

// SetServiceLimit stores the service limit through rgserver (an admin
// call): every replica follows it from etcd.
func (s rpcStore) SetServiceLimit(ctx context.Context, ruPerSec uint64) error {
	if err := resourcegroup.ValidateServiceLimit(ruPerSec); err != nil {
		return err
	}
	err := s.c.call(ctx, func(ctx context.Context, cl tokenpb.ResourceGroupServiceClient) error {
		_, err := cl.SetServiceLimit(ctx, &tokenpb.SetServiceLimitRequest{RuPerSec: ruPerSec})
		return err
	})
	if err != nil {
		return mapError("alter resource control", "", err)
	}
	return nil
}
