package resourcegroup

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// RunawayWatchColumns are the columns of information_schema.runaway_watches,
// in TiDB's order (without TiDB's plan-digest specifics).
func RunawayWatchColumns() []string {
	return []string{"ID", "RESOURCE_GROUP_NAME", "START_TIME", "END_TIME", "WATCH", "WATCH_TEXT", "SOURCE", "ACTION"}
}

// executeWatch runs QUERY WATCH ADD / REMOVE and SELECT ... FROM
// information_schema.runaway_watches against a store that keeps watches.
// For QUERY WATCH ADD the caller fills in what needs the session or the
// wire: Group when the statement names none, and Digest for SQL TEXT
// SIMILAR (resourcegroup parses no SQL beyond its own).
func executeWatch(ctx context.Context, st Statement, store Store) (*Result, error) {
	ws, ok := store.(WatchStore)
	if !ok {
		return nil, NewUnsupported("runaway watches on this store")
	}
	switch s := st.(type) {
	case *QueryWatchAdd:
		return addWatch(ctx, s, store, ws)
	case *QueryWatchRemove:
		if s.ID != 0 {
			// ErrWatchNotFound when there is none, as in TiDB.
			if err := ws.RemoveWatch(ctx, s.ID); err != nil {
				return nil, err
			}
			return &Result{AffectedRows: 1}, nil
		}
		group := NormalizeName(s.Group)
		if _, err := store.GetGroup(ctx, group); err != nil {
			return nil, err
		}
		list, err := ws.ListWatches(ctx)
		if err != nil {
			return nil, err
		}
		if !slices.ContainsFunc(list, func(w Watch) bool { return w.Group == group }) {
			// Removing nothing is an error, as for an id.
			return nil, &Error{Code: CodeUnknown, State: "HY000", Err: ErrWatchNotFound,
				Message: fmt.Sprintf("no runaway watch in resource group '%s'", group)}
		}
		var n uint64
		for _, w := range list {
			if w.Group != group {
				continue
			}
			if err := ws.RemoveWatch(ctx, w.ID); err != nil {
				return nil, err
			}
			n++
		}
		return &Result{AffectedRows: n}, nil
	case *SelectWatches:
		list, err := ws.ListWatches(ctx)
		if err != nil {
			return nil, err
		}
		res := &Result{Columns: RunawayWatchColumns(), Rows: [][]*string{}}
		for _, w := range list {
			res.Rows = append(res.Rows, watchRow(w))
		}
		return res, nil
	}
	return nil, NewSessionBound(st)
}

func addWatch(ctx context.Context, s *QueryWatchAdd, store Store, ws WatchStore) (*Result, error) {
	if s.Group == "" {
		return nil, NewInvalid("QUERY WATCH ADD needs a resource group")
	}
	g, err := store.GetGroup(ctx, s.Group)
	if err != nil {
		return nil, err
	}
	w := Watch{Group: g.Name, Action: s.Action, SwitchGroup: s.SwitchGroup, Match: s.Match, Source: WatchSourceManual}
	if w.Action == ActionNone {
		// As TiDB: without ACTION, the group's QUERY_LIMIT action applies.
		if g.QueryLimit == nil || g.QueryLimit.Action == ActionNone {
			return nil, NewInvalid(fmt.Sprintf("must set runaway config for resource group '%s' or give QUERY WATCH ADD an ACTION", g.Name))
		}
		w.Action, w.SwitchGroup = g.QueryLimit.Action, g.QueryLimit.SwitchGroup
	}
	switch {
	case s.Match == WatchExact:
		w.Text = s.Text
	case s.Digest != "":
		w.Text = s.Digest
	default:
		return nil, NewInvalid("QUERY WATCH ADD ... SIMILAR needs the statement's digest")
	}
	if g.QueryLimit != nil && g.QueryLimit.WatchDuration > 0 {
		w.Expires = time.Now().Add(g.QueryLimit.WatchDuration)
	}
	added, err := ws.AddWatch(ctx, w)
	if err != nil {
		return nil, err
	}
	id := strconv.FormatUint(added.ID, 10)
	return &Result{Columns: []string{"WATCH_ID"}, Rows: [][]*string{{&id}}}, nil
}

// watchRow renders a watch as a runaway_watches row.
func watchRow(w Watch) []*string {
	str := func(s string) *string { return &s }
	end := (*string)(nil)
	if !w.Expires.IsZero() {
		end = str(w.Expires.UTC().Format("2006-01-02 15:04:05"))
	}
	action := w.Action.String()
	if w.Action == ActionSwitchGroup {
		action = "SWITCH_GROUP(" + w.SwitchGroup + ")"
	}
	return []*string{
		str(strconv.FormatUint(w.ID, 10)), str(w.Group),
		str(w.Created.UTC().Format("2006-01-02 15:04:05")), end,
		str(w.Match.String()), str(w.Text), str(w.Source), str(action),
	}
}
