package resourcegroup

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ExplainGroup is EXPLAIN RESOURCE GROUP name [WITH (options)] [FOR LAST n
// unit] (executed by the proxy): what the group's recorded demand over
// the last Last would have met under the options given — its own
// definition for those not given. rgproxy's own; TiDB has no what-if.
type ExplainGroup struct {
	Name string
	// With holds the proposed options; Fields says which were given
	// (RU_PER_SEC and BURSTABLE).
	With   Group
	Fields Field
	// Last is how far back the replay goes: 1 h unless FOR LAST says.
	Last time.Duration
}

func (*ExplainGroup) statement() {}

const (
	// explainDefaultLast is the window EXPLAIN RESOURCE GROUP replays
	// without FOR LAST: the usage history's finest hour.
	explainDefaultLast = time.Hour
	// explainMaxLast is the longest window: the usage history keeps 400
	// days of hours.
	explainMaxLast = 400 * 24 * time.Hour
	// explainOptions are the options a what-if may propose.
	explainOptions = FieldRUPerSec | FieldBurst
)

// explainUnits are FOR LAST's units, singular and plural.
var explainUnits = map[string]time.Duration{
	"SECOND": time.Second, "SECONDS": time.Second,
	"MINUTE": time.Minute, "MINUTES": time.Minute,
	"HOUR": time.Hour, "HOURS": time.Hour,
	"DAY": 24 * time.Hour, "DAYS": 24 * time.Hour,
}

// explain parses EXPLAIN RESOURCE GROUP ...; the current token is EXPLAIN.
func (p *parser) explain() (Statement, error) {
	if err := p.expectWords("EXPLAIN", "RESOURCE", "GROUP"); err != nil {
		return nil, err
	}
	name, err := p.groupName()
	if err != nil {
		return nil, err
	}
	st := &ExplainGroup{Name: name, Last: explainDefaultLast}
	if p.isWord("WITH") {
		if err := p.advance(); err != nil {
			return nil, err
		}
		if err := p.expectPunct("("); err != nil {
			return nil, err
		}
		start := p.tok
		st.With, st.Fields, err = p.options()
		if err != nil {
			return nil, err
		}
		if st.Fields == 0 {
			return nil, p.failWhy("expected a proposed RU_PER_SEC or BURSTABLE, not %s")
		}
		if st.Fields&^explainOptions != 0 {
			return nil, NewSyntaxWhy(p.lex.src, start.pos, "EXPLAIN RESOURCE GROUP ... WITH proposes RU_PER_SEC and BURSTABLE only")
		}
		if err := p.expectPunct(")"); err != nil {
			return nil, err
		}
	}
	if p.isWord("FOR") {
		if err := p.advance(); err != nil {
			return nil, err
		}
		if err := p.expectWords("LAST"); err != nil {
			return nil, err
		}
		if st.Last, err = p.lastWindow(); err != nil {
			return nil, err
		}
	}
	if !p.atEnd() {
		return nil, p.failWhy("expected WITH (...), FOR LAST or the end of the statement, not %s")
	}
	return st, nil
}

// lastWindow reads FOR LAST's "n unit".
func (p *parser) lastWindow() (time.Duration, error) {
	if p.tok.kind != tkNumber {
		return 0, p.failWhy("FOR LAST takes a whole number of SECONDS, MINUTES, HOURS or DAYS, not %s")
	}
	text := p.tok.text
	n, err := strconv.ParseUint(text, 10, 32)
	if err != nil || n == 0 {
		return 0, NewInvalid(fmt.Sprintf("EXPLAIN RESOURCE GROUP: FOR LAST %s is not a whole number from 1", text))
	}
	if err := p.advance(); err != nil {
		return 0, err
	}
	word := strings.ToUpper(p.tok.text)
	unit, ok := explainUnits[word]
	if p.tok.kind != tkWord || !ok {
		return 0, p.failWhy("FOR LAST n takes SECONDS, MINUTES, HOURS or DAYS, not %s")
	}
	if n > uint64(explainMaxLast/unit) {
		return 0, NewInvalid(fmt.Sprintf("EXPLAIN RESOURCE GROUP: FOR LAST %s %s is beyond the usage history's 400 days", text, word))
	}
	return time.Duration(n) * unit, p.advance()
}
