package resourcegroup

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// The bounds of every number and duration an administrator can type. The
// README ("Resource groups") lists them; each error names the field and
// its range.
const (
	// MaxRU bounds RU_PER_SEC (besides UNLIMITED) and QUERY_LIMIT RU:
	// 10¹⁵ RU, far beyond any rate or statement, and exact in a float64.
	MaxRU uint64 = 1_000_000_000_000_000
	// MaxConcurrencyCap bounds MAX_CONCURRENCY: MariaDB's largest
	// max_connections.
	MaxConcurrencyCap uint64 = 100_000
	// DurationUnit is the unit and the least value of EXEC_ELAPSED and a
	// watch's DURATION: rgserver keeps them in whole milliseconds.
	DurationUnit = time.Millisecond
	// MaxExecElapsed bounds QUERY_LIMIT EXEC_ELAPSED: a week.
	MaxExecElapsed = 7 * 24 * time.Hour
	// MaxWatchDuration bounds a runaway watch's DURATION (UNLIMITED aside):
	// a year.
	MaxWatchDuration = 365 * 24 * time.Hour
)

// nameRule is what a new group name may be, as the errors say it.
var nameRule = fmt.Sprintf("a resource group name is 1 to %d bytes of letters, digits, '_' and '$'", MaxNameLength)

// NormalizeName returns the canonical (lower-case) form of a group name;
// names are case-insensitive.
func NormalizeName(name string) string { return strings.ToLower(name) }

// ValidateName checks a name that refers to a group, which may predate
// ValidateNewName's rule: not empty, valid UTF-8, at most MaxNameLength
// characters. Lookups, DROP, bindings and rgserver's token requests use
// it, so that a group stored under an older, looser rule stays usable and
// can be dropped. It does not normalize.
func ValidateName(name string) error {
	if name == "" {
		return NewInvalid(msgNameEmpty)
	}
	if n := utf8.RuneCountInString(name); n > MaxNameLength {
		return NewInvalid(fmt.Sprintf("%s: a name of %d characters, at most %d are allowed", msgNameTooLong, n, MaxNameLength))
	}
	if !utf8.ValidString(name) {
		return NewInvalid(msgInvalidSetting + ": resource group name is not valid UTF-8")
	}
	return nil
}

// ValidateNewName checks the name of a group being created, as TiDB does
// (an identifier of at most MaxNameLength bytes) and more strictly: only
// what an unquoted MySQL identifier holds — ASCII letters, digits, '_' and
// '$' — and the letters, digits and combining marks of other scripts. No
// space, quote, punctuation, control character (NUL, LF) or invisible
// format character (the bidirectional overrides U+202A–U+202E and
// U+2066–U+2069, U+200E, U+200F), so a name reads as what it is wherever
// it is shown.
func ValidateNewName(name string) error {
	if name == "" {
		return NewInvalid(msgNameEmpty + "; " + nameRule)
	}
	if !utf8.ValidString(name) {
		return NewInvalid(msgInvalidSetting + ": resource group name is not valid UTF-8; " + nameRule)
	}
	i := 0
	for _, r := range name {
		i++
		if !nameRune(r) {
			return NewInvalid(fmt.Sprintf("%s: resource group name holds %s at character %d; %s",
				msgInvalidSetting, describeRune(r), i, nameRule))
		}
	}
	if len(name) > MaxNameLength {
		return NewInvalid(fmt.Sprintf("%s: '%s' has %d bytes; %s", msgNameTooLong, name, len(name), nameRule))
	}
	return nil
}

// nameRune reports whether r may appear in a new group name.
func nameRune(r rune) bool {
	if r < utf8.RuneSelf {
		return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '_' || r == '$'
	}
	return unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r)
}

// describeRune names a character for an error message without writing it
// there: a control or format character would disturb the message.
func describeRune(r rune) string {
	if r < utf8.RuneSelf && strconv.IsPrint(r) && r != ' ' {
		return fmt.Sprintf("'%c' (U+%04X)", r, r)
	}
	return fmt.Sprintf("U+%04X", r)
}

// hiddenRune reports whether r is a character a tag may not hold: a
// control character, a format character (the bidirectional controls,
// zero-width characters) or a line or paragraph separator.
func hiddenRune(r rune) bool {
	return unicode.Is(unicode.Cc, r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029'
}

// ValidateNewTag checks the tag of a tag binding being created:
// ValidateTag's rule, and neither part may hold a control, format
// (bidirectional) or line-separator character. Tags bound under the
// looser rule of earlier versions stay readable and can be dropped.
func ValidateNewTag(key, value string) error {
	if err := ValidateTag(key, value); err != nil {
		return err
	}
	for _, part := range [2]struct{ what, s string }{{"key", key}, {"value", value}} {
		i := 0
		for _, r := range part.s {
			i++
			if hiddenRune(r) {
				return NewInvalid(fmt.Sprintf("%s: the tag %s holds %s at character %d; a tag key or value is 1 "+
					"(the value 0) to %d bytes of UTF-8 without control, format or line-separator characters",
					msgInvalidTag, part.what, describeRune(r), i, MaxTagLength))
			}
		}
	}
	return nil
}

// DefaultGroupDefinition is the definition of the group that always exists.
func DefaultGroupDefinition() Group {
	return Group{Name: DefaultGroup, RUPerSec: Unlimited, Priority: PriorityMedium, Burst: BurstUnlimited}
}

// ValidateNew checks a definition about to be created: its name follows
// ValidateNewName, the rest Validate.
func (g *Group) ValidateNew() error {
	if err := ValidateNewName(g.Name); err != nil {
		return err
	}
	return g.Validate()
}

// Validate checks a whole definition, as CREATE and ALTER write it; the
// name only as ValidateName checks it (a group created under an older
// rule can still be altered). It returns an *Error wrapping ErrInvalid
// whose message starts with TiDB's wording and names the field and its
// range.
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
	if g.RUPerSec != Unlimited && g.RUPerSec > MaxRU {
		return errRU("RU_PER_SEC", strconv.FormatUint(g.RUPerSec, 10), true)
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
	if g.MaxConcurrency > MaxConcurrencyCap {
		return errMaxConcurrency(strconv.FormatUint(g.MaxConcurrency, 10))
	}
	if g.QueryLimit != nil {
		if err := g.QueryLimit.validate(g.Name); err != nil {
			return err
		}
	}
	return validateBudgets(g.Budgets, g.RUPerSec)
}

// errRU is 1105 for an RU amount out of its range.
func errRU(field, typed string, unlimited bool) *Error {
	or := ""
	if unlimited {
		or = ", or UNLIMITED"
	}
	return NewInvalid(fmt.Sprintf("%s: %s = %s is out of range; %s is 1 to %d%s", msgInvalidSetting, field, typed, field, MaxRU, or))
}

// errBackground is 1105 for a UTILIZATION_LIMIT out of its range.
func errBackground(typed string) *Error {
	return NewInvalid(fmt.Sprintf("%s: BACKGROUND's UTILIZATION_LIMIT = %s is out of range; it is a percent of the service limit, 1 to 100 "+
		"(BACKGROUND = NULL: a foreground group)", msgInvalidSetting, typed))
}

// errMaxConcurrency is 1105 for a MAX_CONCURRENCY out of its range.
func errMaxConcurrency(typed string) *Error {
	return NewInvalid(fmt.Sprintf("%s: MAX_CONCURRENCY = %s is out of range; MAX_CONCURRENCY is 0 to %d "+
		"(0, NULL or UNLIMITED: no cap)", msgInvalidSetting, typed, MaxConcurrencyCap))
}

// hours writes a whole number of hours as "168h".
func hours(d time.Duration) string { return strconv.FormatInt(int64(d/time.Hour), 10) + "h" }

// checkDuration checks a duration d, written typed, against [DurationUnit,
// max] in whole DurationUnits. msg is TiDB's leading words, field the
// option's name; unlimited says that UNLIMITED is also allowed.
func checkDuration(msg, field, typed string, d, max time.Duration, unlimited bool) error {
	rng := durationRange(field, max, unlimited)
	switch {
	case d < DurationUnit || d > max:
		return NewInvalid(fmt.Sprintf("%s: %s = '%s' is out of range; %s", msg, field, typed, rng))
	case d%DurationUnit != 0:
		return NewInvalid(fmt.Sprintf("%s: %s = '%s' is not a whole number of milliseconds; %s", msg, field, typed, rng))
	}
	return nil
}

// durationRange says which values of duration option field are allowed.
func durationRange(field string, max time.Duration, unlimited bool) string {
	or := ""
	if unlimited {
		or = ", or UNLIMITED"
	}
	return fmt.Sprintf("%s is 1ms to %s in whole milliseconds%s", field, hours(max), or)
}

// validate checks a QUERY_LIMIT of the group named owner.
func (q *QueryLimit) validate(owner string) error {
	switch {
	case q.ExecElapsed == 0 && q.RU == 0:
		return NewInvalid(msgInvalidSetting + ": QUERY_LIMIT needs a limit, EXEC_ELAPSED or RU, besides its ACTION")
	case q.ExecElapsed != 0 && q.RU > 0:
		return NewInvalid(msgInvalidSetting + ": QUERY_LIMIT takes only one of EXEC_ELAPSED and RU")
	case q.ExecElapsed != 0:
		if err := checkDuration(msgInvalidElapsed, "EXEC_ELAPSED", q.ExecElapsed.String(), q.ExecElapsed, MaxExecElapsed, false); err != nil {
			return err
		}
	case q.RU > MaxRU:
		return errRU("QUERY_LIMIT RU", strconv.FormatUint(q.RU, 10), false)
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
		if q.WatchDuration != 0 {
			if err := checkDuration(msgInvalidWatch, "DURATION", q.WatchDuration.String(), q.WatchDuration, MaxWatchDuration, true); err != nil {
				return err
			}
		}
	default:
		return NewInvalid(fmt.Sprintf("%s: unknown WATCH type %d", msgInvalidWatch, q.Watch))
	}
	return nil
}
