package resourcegroup

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// NormalizeName returns the canonical (lower-case) form of a group name;
// names are case-insensitive.
func NormalizeName(name string) string { return strings.ToLower(name) }

// ValidateName checks a group name's length; it does not normalize it.
func ValidateName(name string) error {
	if name == "" {
		return NewInvalid(msgNameEmpty)
	}
	if n := utf8.RuneCountInString(name); n > MaxNameLength {
		return NewInvalid(fmt.Sprintf("%s: '%s' has %d characters, at most %d are allowed", msgNameTooLong, name, n, MaxNameLength))
	}
	if !utf8.ValidString(name) {
		return NewInvalid(msgInvalidSetting + ": resource group name is not valid UTF-8")
	}
	return nil
}

// DefaultGroupDefinition is the definition of the group that always exists.
func DefaultGroupDefinition() Group {
	return Group{Name: DefaultGroup, RUPerSec: Unlimited, Priority: PriorityMedium, Burst: BurstUnlimited}
}

// Validate checks a whole definition. It returns an *Error wrapping
// ErrInvalid whose message starts with TiDB's wording.
func (g *Group) Validate() error {
	if err := ValidateName(g.Name); err != nil {
		return err
	}
	if g.Name != NormalizeName(g.Name) {
		return NewInvalid(fmt.Sprintf("%s: resource group name '%s' is not in lower case", msgInvalidSetting, g.Name))
	}
	if g.RUPerSec == 0 {
		return NewInvalid(msgUnknownMode + ": RU_PER_SEC is required (a positive integer, or UNLIMITED)")
	}
	if g.Priority > PriorityHigh {
		return NewInvalid(fmt.Sprintf("%s: unknown PRIORITY %d", msgInvalidSetting, g.Priority))
	}
	if g.Burst > BurstUnlimited {
		return NewInvalid(fmt.Sprintf("%s: unknown BURSTABLE mode %d", msgInvalidSetting, g.Burst))
	}
	if g.Mode > ModeOff {
		return NewInvalid(fmt.Sprintf("%s: unknown MODE %d", msgInvalidSetting, g.Mode))
	}
	if g.MaxConcurrency > 1<<31 {
		return NewInvalid(fmt.Sprintf("%s: MAX_CONCURRENCY %d is out of range", msgInvalidSetting, g.MaxConcurrency))
	}
	if g.QueryLimit != nil {
		return g.QueryLimit.validate(g.Name)
	}
	return nil
}

// validate checks a QUERY_LIMIT of the group named owner.
func (q *QueryLimit) validate(owner string) error {
	switch {
	case q.ExecElapsed < 0:
		return NewInvalid(msgInvalidElapsed + ": EXEC_ELAPSED must be positive")
	case q.ExecElapsed == 0 && q.RU == 0:
		return NewInvalid(msgInvalidSetting + ": QUERY_LIMIT needs a limit, EXEC_ELAPSED or RU, besides its ACTION")
	case q.ExecElapsed > 0 && q.RU > 0:
		return NewInvalid(msgInvalidSetting + ": QUERY_LIMIT takes only one of EXEC_ELAPSED and RU")
	}
	switch q.Action {
	case ActionDryRun, ActionCooldown, ActionKill:
		if q.SwitchGroup != "" {
			return NewInvalid(msgSwitchTarget + ": a switch group is only allowed with ACTION=SWITCH_GROUP")
		}
	case ActionSwitchGroup:
		if err := ValidateName(q.SwitchGroup); err != nil {
			return NewInvalid(msgSwitchTarget + ": " + err.Error())
		}
		if q.SwitchGroup != NormalizeName(q.SwitchGroup) {
			return NewInvalid(fmt.Sprintf("%s: '%s' is not in lower case", msgSwitchTarget, q.SwitchGroup))
		}
		if q.SwitchGroup == owner {
			return NewInvalid(fmt.Sprintf("%s: SWITCH_GROUP target must differ from the group itself ('%s')", msgSwitchTarget, owner))
		}
	default:
		return NewInvalid(msgUnknownAction)
	}
	switch q.Watch {
	case WatchNone:
		if q.WatchDuration != 0 {
			return NewInvalid(msgInvalidWatch + ": DURATION needs WATCH")
		}
	case WatchExact, WatchSimilar:
		if q.WatchDuration < 0 {
			return NewInvalid(msgInvalidWatch + ": DURATION must not be negative")
		}
	default:
		return NewInvalid(fmt.Sprintf("%s: unknown WATCH type %d", msgInvalidWatch, q.Watch))
	}
	return nil
}
