package tokenpb

import (
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

// Conversions between resourcegroup's types and their wire form, shared by
// rgserver and the proxy's client so both sides agree field by field.

// GroupToPB converts a definition to its wire form.
func GroupToPB(g resourcegroup.Group) *ResourceGroup {
	out := &ResourceGroup{
		Name:     g.Name,
		RuPerSec: g.RUPerSec,
		Priority: Priority(g.Priority),
		Burst:    BurstMode(g.Burst),
		Version:  g.Version,
		Mode:     uint32(g.Mode),

		MaxConcurrency: g.MaxConcurrency,
		Parent:         g.Parent,
		Background:     uint32(g.Background),
	}
	if g.RUPerSec == resourcegroup.Unlimited {
		out.RuPerSec, out.Unlimited = 0, true
	}
	if q := g.QueryLimit; q != nil {
		out.QueryLimit = &QueryLimit{
			ExecElapsedMs:   q.ExecElapsed.Milliseconds(),
			Ru:              q.RU,
			Action:          Action(q.Action),
			SwitchGroup:     q.SwitchGroup,
			Watch:           WatchType(q.Watch),
			WatchDurationMs: q.WatchDuration.Milliseconds(),
		}
	}
	for _, b := range g.Budgets {
		wire := &Budget{Ru: b.RU, Period: b.Period.String(), Triggers: make([]*BudgetTrigger, len(b.Triggers))}
		for i, t := range b.Triggers {
			wire.Triggers[i] = &BudgetTrigger{Percent: t.Percent, Action: t.Action.String(), ThrottleRuPerSec: t.ThrottleRUPerSec}
		}
		out.Budgets = append(out.Budgets, wire)
	}
	return out
}

// GroupFromPB converts the wire form to a definition (not validated).
func GroupFromPB(p *ResourceGroup) resourcegroup.Group {
	if p == nil {
		return resourcegroup.Group{}
	}
	g := resourcegroup.Group{
		Name:     p.GetName(),
		RUPerSec: p.GetRuPerSec(),
		Priority: resourcegroup.Priority(p.GetPriority()),
		Burst:    resourcegroup.BurstMode(p.GetBurst()),
		Version:  p.GetVersion(),
		Mode:     resourcegroup.Mode(min(p.GetMode(), 255)),

		MaxConcurrency: p.GetMaxConcurrency(),
		Parent:         p.GetParent(),
		Background:     uint8(min(p.GetBackground(), 100)),
	}
	if p.GetUnlimited() {
		g.RUPerSec = resourcegroup.Unlimited
	}
	if q := p.GetQueryLimit(); q != nil {
		g.QueryLimit = &resourcegroup.QueryLimit{
			ExecElapsed:   time.Duration(q.GetExecElapsedMs()) * time.Millisecond,
			RU:            q.GetRu(),
			Action:        resourcegroup.Action(q.GetAction()),
			SwitchGroup:   q.GetSwitchGroup(),
			Watch:         resourcegroup.WatchType(q.GetWatch()),
			WatchDuration: time.Duration(q.GetWatchDurationMs()) * time.Millisecond,
		}
	}
	g.Budgets = BudgetsFromPB(p.GetBudgets())
	return g
}

// BudgetsFromPB converts budgets from the wire (not validated): a period
// or an action that is not one of the names becomes resourcegroup's zero
// value, which Group.Validate refuses. None is nil.
func BudgetsFromPB(ps []*Budget) []resourcegroup.Budget {
	if len(ps) == 0 {
		return nil
	}
	out := make([]resourcegroup.Budget, len(ps))
	for i, p := range ps {
		period, _ := resourcegroup.ParseBudgetPeriod(p.GetPeriod())
		b := resourcegroup.Budget{Period: period, RU: p.GetRu()}
		if ts := p.GetTriggers(); len(ts) > 0 {
			b.Triggers = make([]resourcegroup.BudgetTrigger, len(ts))
			for j, t := range ts {
				action, _ := resourcegroup.ParseBudgetAction(t.GetAction())
				b.Triggers[j] = resourcegroup.BudgetTrigger{Percent: t.GetPercent(), Action: action, ThrottleRUPerSec: t.GetThrottleRuPerSec()}
			}
		}
		out[i] = b
	}
	return out
}

// BindingToPB converts a binding to its wire form.
func BindingToPB(b resourcegroup.Binding) *Binding {
	return &Binding{User: b.User, Host: b.Host, Group: b.Group, TagKey: b.TagKey, TagValue: b.TagValue, Digest: b.Digest}
}

// BindingFromPB converts the wire form to a binding.
func BindingFromPB(p *Binding) resourcegroup.Binding {
	return resourcegroup.Binding{User: p.GetUser(), Host: p.GetHost(), Group: p.GetGroup(),
		TagKey: p.GetTagKey(), TagValue: p.GetTagValue(), Digest: p.GetDigest()}
}

// WatchToPB converts a runaway watch entry to its wire form. Times travel
// as Unix milliseconds; the zero time is 0.
func WatchToPB(w resourcegroup.Watch) *RunawayWatch {
	return &RunawayWatch{
		Id: w.ID, Group: w.Group, Action: Action(w.Action), SwitchGroup: w.SwitchGroup,
		Match: WatchType(w.Match), Text: w.Text, Source: w.Source,
		CreatedUnixMs: unixMs(w.Created), ExpiresUnixMs: unixMs(w.Expires),
	}
}

// WatchFromPB converts the wire form to a watch entry (not validated).
func WatchFromPB(p *RunawayWatch) resourcegroup.Watch {
	if p == nil {
		return resourcegroup.Watch{}
	}
	return resourcegroup.Watch{
		ID: p.GetId(), Group: p.GetGroup(), Action: resourcegroup.Action(p.GetAction()),
		SwitchGroup: p.GetSwitchGroup(), Match: resourcegroup.WatchType(p.GetMatch()), Text: p.GetText(),
		Source: p.GetSource(), Created: fromUnixMs(p.GetCreatedUnixMs()), Expires: fromUnixMs(p.GetExpiresUnixMs()),
	}
}

func unixMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromUnixMs(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// A ResourceGroupService error that stands for a *resourcegroup.Error
// carries an errdetails.ErrorInfo with this domain, one of the Reason
// values below, and the MySQL code and SQLSTATE in its metadata.
const (
	ErrorDomain       = "rgproxy.token.v1"
	ErrorMetaCode     = "mysql_code"
	ErrorMetaSQLState = "sql_state"

	ReasonExists   = "EXISTS"
	ReasonNotFound = "NOT_FOUND"
	ReasonInvalid  = "INVALID"
	ReasonConflict = "CONFLICT"
	// ReasonReserved: dropping the `default` group (ErrInvalid).
	ReasonReserved = "RESERVED"
	// ReasonWatchNotFound: removing an unknown runaway watch
	// (ErrWatchNotFound).
	ReasonWatchNotFound = "WATCH_NOT_FOUND"
)

// ErrorInfo describes e for a status's details.
func ErrorInfo(e *resourcegroup.Error, reason string) *errdetails.ErrorInfo {
	return &errdetails.ErrorInfo{
		Reason: reason, Domain: ErrorDomain,
		Metadata: map[string]string{ErrorMetaCode: strconv.Itoa(int(e.Code)), ErrorMetaSQLState: e.State},
	}
}

// ErrorFromStatus turns a gRPC error from ResourceGroupService back into
// the *resourcegroup.Error it stands for (so errors.Is(err,
// resourcegroup.ErrExists) and the MySQL code work on the proxy side). Any
// other error is returned unchanged.
func ErrorFromStatus(err error) error {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return err
	}
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok || info.GetDomain() != ErrorDomain {
			continue
		}
		var sentinel error
		switch info.GetReason() {
		case ReasonExists:
			sentinel = resourcegroup.ErrExists
		case ReasonNotFound:
			sentinel = resourcegroup.ErrNotFound
		case ReasonConflict:
			sentinel = resourcegroup.ErrConflict
		case ReasonInvalid, ReasonReserved:
			sentinel = resourcegroup.ErrInvalid
		case ReasonWatchNotFound:
			sentinel = resourcegroup.ErrWatchNotFound
		default:
			return err
		}
		code, cerr := strconv.ParseUint(info.GetMetadata()[ErrorMetaCode], 10, 16)
		if cerr != nil {
			code = uint64(resourcegroup.CodeUnknown)
		}
		state := info.GetMetadata()[ErrorMetaSQLState]
		if len(state) != 5 {
			state = "HY000"
		}
		return &resourcegroup.Error{Code: uint16(code), State: state, Message: st.Message(), Err: sentinel}
	}
	return err
}
