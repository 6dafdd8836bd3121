package tokenpb

import (
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

// GroupToPB converts a definition to its wire form. Both ends of the
// protocol use these converters so that the mapping exists once.
func GroupToPB(g resourcegroup.Group) *ResourceGroup {
	pb := &ResourceGroup{
		Name:     g.Name,
		Priority: Priority(g.Priority),
		Burst:    BurstMode(g.Burst),
		Version:  g.Version,
	}
	if g.RUPerSec == resourcegroup.Unlimited {
		pb.Unlimited = true
	} else {
		pb.RuPerSec = g.RUPerSec
	}
	if q := g.QueryLimit; q != nil {
		pb.QueryLimit = &QueryLimit{
			ExecElapsedMs:   q.ExecElapsed.Milliseconds(),
			Ru:              q.RU,
			Action:          Action(q.Action),
			SwitchGroup:     q.SwitchGroup,
			Watch:           WatchType(q.Watch),
			WatchDurationMs: q.WatchDuration.Milliseconds(),
		}
	}
	return pb
}

// GroupFromPB converts a wire definition back; nil gives the zero Group.
func GroupFromPB(pb *ResourceGroup) resourcegroup.Group {
	if pb == nil {
		return resourcegroup.Group{}
	}
	g := resourcegroup.Group{
		Name:     pb.GetName(),
		RUPerSec: pb.GetRuPerSec(),
		Priority: resourcegroup.Priority(pb.GetPriority()),
		Burst:    resourcegroup.BurstMode(pb.GetBurst()),
		Version:  pb.GetVersion(),
	}
	if pb.GetUnlimited() {
		g.RUPerSec = resourcegroup.Unlimited
	}
	if q := pb.GetQueryLimit(); q != nil {
		g.QueryLimit = &resourcegroup.QueryLimit{
			ExecElapsed:   time.Duration(q.GetExecElapsedMs()) * time.Millisecond,
			RU:            q.GetRu(),
			Action:        resourcegroup.Action(q.GetAction()),
			SwitchGroup:   q.GetSwitchGroup(),
			Watch:         resourcegroup.WatchType(q.GetWatch()),
			WatchDuration: time.Duration(q.GetWatchDurationMs()) * time.Millisecond,
		}
	}
	return g
}

// BindingToPB converts a binding to its wire form.
func BindingToPB(b resourcegroup.Binding) *Binding {
	return &Binding{User: b.User, Host: b.Host, Group: b.Group}
}

// BindingFromPB converts a wire binding back; nil gives the zero Binding.
func BindingFromPB(pb *Binding) resourcegroup.Binding {
	return resourcegroup.Binding{User: pb.GetUser(), Host: pb.GetHost(), Group: pb.GetGroup()}
}
