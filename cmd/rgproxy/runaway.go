package main

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

// killTimeout bounds one KILL QUERY on the service connection.
const killTimeout = 5 * time.Second

// errKillNeedsService refuses a QUERY_LIMIT with ACTION=KILL when rgproxy
// has no service account to kill with.
var errKillNeedsService = resourcegroup.NewInvalid(
	"QUERY_LIMIT ACTION=KILL needs rgproxy's service account: start every rgproxy with --admin-user and --admin-password-file")

// runawayGuard watches one statement against its group's EXEC_ELAPSED
// limit. The timer's callback runs on its own goroutine; the session
// goroutine disarms the guard in After and, if it fired, waits for the
// action (a KILL) to have returned before the session's next command.
type runawayGuard struct {
	rule  resourcegroup.QueryLimit
	group string
	timer *time.Timer
	fired atomic.Bool
	done  chan struct{} // closed when the fired action completed
}

// armRunaway starts the guard of a statement about to be forwarded, or
// returns nil when its group has no EXEC_ELAPSED limit.
func (s *rgSession) armRunaway(g resourcegroup.Group) *runawayGuard {
	q := g.QueryLimit
	if q == nil || q.ExecElapsed <= 0 {
		return nil
	}
	gd := &runawayGuard{rule: *q, group: g.Name, done: make(chan struct{})}
	connID := s.connID
	gd.timer = time.AfterFunc(q.ExecElapsed, func() {
		defer close(gd.done)
		gd.fired.Store(true)
		s.p.metrics.runaway.WithLabelValues(gd.group, gd.rule.Action.String()).Inc()
		s.p.logger.Info("runaway statement", "resource_group", gd.group, "action", gd.rule.Action.String(),
			"exec_elapsed", gd.rule.ExecElapsed, "backend_connection", connID)
		if gd.rule.Action == resourcegroup.ActionKill && s.p.service != nil {
			ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
			defer cancel()
			if err := s.p.service.KillQuery(ctx, connID); err != nil {
				s.p.logger.Warn("killing a runaway statement failed", "err", err)
			}
		}
	})
	return gd
}

// disarm stops the guard once the statement's response is over and reports
// whether it fired; if so it waits for the action to be done.
func (gd *runawayGuard) disarm() bool {
	if gd == nil {
		return false
	}
	if gd.timer.Stop() {
		return false
	}
	<-gd.done
	return true
}

// checkKillRule refuses a CREATE or ALTER that would give a group a KILL
// action on a proxy without a service account.
func (s *rgSession) checkKillRule(stmt resourcegroup.Statement) error {
	if s.p.service != nil {
		return nil
	}
	var q *resourcegroup.QueryLimit
	switch st := stmt.(type) {
	case *resourcegroup.CreateGroup:
		q = st.Group.QueryLimit
	case *resourcegroup.AlterGroup:
		if st.Fields&resourcegroup.FieldQueryLimit != 0 {
			q = st.Options.QueryLimit
		}
	}
	if q != nil && q.Action == resourcegroup.ActionKill {
		return errKillNeedsService
	}
	return nil
}

// chargeGroupAfter is the group the rest of a statement is charged to:
// after SWITCH_GROUP fired, the target group.
func (s *rgSession) chargeGroupAfter(gd *runawayGuard, fired bool) string {
	if fired && gd.rule.Action == resourcegroup.ActionSwitchGroup {
		if _, ok := s.p.tokens.Group(gd.rule.SwitchGroup); ok {
			return gd.rule.SwitchGroup
		}
	}
	return s.group
}
