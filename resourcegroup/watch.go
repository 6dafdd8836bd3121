package resourcegroup

import "strconv"

// Runaway watches (QUERY WATCH) are parsed now and executed in a later
// issue; Execute answers them with 1235.

// QueryWatchAdd is QUERY WATCH ADD [RESOURCE GROUP name] [ACTION action]
// SQL TEXT EXACT|SIMILAR TO 'text' | SQL DIGEST 'digest'.
type QueryWatchAdd struct {
	// Group is the watched group; "" = the session's group.
	Group string
	// Action is ActionNone when the statement names none (the group's
	// QUERY_LIMIT action applies).
	Action      Action
	SwitchGroup string
	// Match is WatchExact or WatchSimilar for SQL TEXT, WatchSimilar for
	// SQL DIGEST (Digest is then set instead of Text).
	Match  WatchType
	Text   string
	Digest string
}

// QueryWatchRemove is QUERY WATCH REMOVE id | RESOURCE GROUP name.
type QueryWatchRemove struct {
	// ID is the watch entry to remove; 0 when Group is set.
	ID uint64
	// Group removes every watch of a group.
	Group string
}

// SelectWatches is SELECT * FROM information_schema.runaway_watches.
type SelectWatches struct{}

func (*QueryWatchAdd) statement()    {}
func (*QueryWatchRemove) statement() {}
func (*SelectWatches) statement()    {}

// queryWatch parses QUERY WATCH ADD / REMOVE.
func (p *parser) queryWatch() (Statement, error) {
	if err := p.expectWords("QUERY", "WATCH"); err != nil {
		return nil, err
	}
	switch {
	case p.isWord("ADD"):
		if err := p.advance(); err != nil {
			return nil, err
		}
		return p.watchAdd()
	case p.isWord("REMOVE"):
		if err := p.advance(); err != nil {
			return nil, err
		}
		if p.tok.kind == tkNumber {
			id, err := strconv.ParseUint(p.tok.text, 10, 64)
			if err != nil || id == 0 {
				return nil, NewInvalid(msgInvalidWatch + ": watch id " + p.tok.text + " is out of range")
			}
			return &QueryWatchRemove{ID: id}, p.advance()
		}
		if err := p.expectWords("RESOURCE", "GROUP"); err != nil {
			return nil, err
		}
		name, err := p.groupName()
		if err != nil {
			return nil, err
		}
		return &QueryWatchRemove{Group: name}, nil
	}
	return nil, p.fail()
}

// watchAdd parses QUERY WATCH ADD's options, in any order, each once.
func (p *parser) watchAdd() (Statement, error) {
	st := &QueryWatchAdd{}
	var seenGroup, seenAction, seenMatch bool
	for p.tok.kind != tkEOF && !p.isPunct(";") {
		start := p.tok.pos
		var dup bool
		switch {
		case p.isWord("RESOURCE"):
			dup, seenGroup = seenGroup, true
			if err := p.expectWords("RESOURCE", "GROUP"); err != nil {
				return nil, err
			}
			name, err := p.groupName()
			if err != nil {
				return nil, err
			}
			st.Group = name
		case p.isWord("ACTION"):
			dup, seenAction = seenAction, true
			if err := p.advance(); err != nil {
				return nil, err
			}
			if err := p.optionalEq(); err != nil {
				return nil, err
			}
			var q QueryLimit
			if err := p.action(&q); err != nil {
				return nil, err
			}
			st.Action, st.SwitchGroup = q.Action, q.SwitchGroup
		case p.isWord("SQL"):
			dup, seenMatch = seenMatch, true
			if err := p.advance(); err != nil {
				return nil, err
			}
			switch {
			case p.isWord("TEXT"):
				if err := p.advance(); err != nil {
					return nil, err
				}
				switch {
				case p.isWord("EXACT"):
					st.Match = WatchExact
				case p.isWord("SIMILAR"):
					st.Match = WatchSimilar
				case p.isWord("PLAN"):
					return nil, NewUnsupported("QUERY WATCH ... SQL TEXT PLAN")
				default:
					return nil, p.fail()
				}
				if err := p.advance(); err != nil {
					return nil, err
				}
				if err := p.expectWords("TO"); err != nil {
					return nil, err
				}
				if p.tok.kind != tkString {
					return nil, p.fail()
				}
				st.Text = p.tok.text
			case p.isWord("DIGEST"):
				if err := p.advance(); err != nil {
					return nil, err
				}
				if p.tok.kind != tkString {
					return nil, p.fail()
				}
				st.Match, st.Digest = WatchSimilar, p.tok.text
			default:
				return nil, p.fail()
			}
			if err := p.advance(); err != nil {
				return nil, err
			}
		case p.isWord("PLAN"):
			return nil, NewUnsupported("QUERY WATCH ... PLAN DIGEST")
		default:
			return nil, p.fail()
		}
		if dup {
			return nil, NewSyntax(p.lex.src, start)
		}
		if _, err := p.acceptPunct(","); err != nil {
			return nil, err
		}
	}
	if !seenMatch {
		return nil, NewInvalid(msgInvalidWatch + ": QUERY WATCH ADD needs SQL TEXT or SQL DIGEST")
	}
	if st.Action == ActionSwitchGroup && st.SwitchGroup == st.Group {
		return nil, NewInvalid(msgSwitchTarget + ": SWITCH_GROUP target must differ from the watched group")
	}
	return st, nil
}
