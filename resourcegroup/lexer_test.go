package resourcegroup

import (
	"testing"

	"github.com/rgproxy/rgproxy/sqltext"
)

func TestLexStrings(t *testing.T) {
	tests := []struct{ lit, want string }{
		{`'plain'`, "plain"},
		{`'it''s'`, "it's"},
		{`"say ""hi"""`, `say "hi"`},
		{`'a\nb\tc\rd\0e\bf\Zg\\h\'i\%'`, "a\nb\tc\rd\x00e\bf\x1ag\\h'i\\%"}, // \% keeps its backslash, as in the server
		{`"\""`, `"`},
		{`'é'`, "é"},
	}
	for _, tt := range tests {
		st, err := Parse("SELECT * FROM information_schema.resource_groups WHERE name = "+tt.lit, sqltext.Mode{})
		if err != nil {
			t.Fatalf("%s: %v", tt.lit, err)
		}
		if got := st.(*SelectGroups).Name; got != NormalizeName(tt.want) {
			t.Errorf("%s lexes as %q, want %q", tt.lit, got, tt.want)
		}
	}
	// Backquotes do not take backslash escapes and double to escape.
	st, err := Parse("SET RESOURCE GROUP `a\\``b`", sqltext.Mode{})
	if err != nil {
		t.Fatal(err)
	}
	if got := st.(*SetGroup).Name; got != "a\\`b" {
		t.Errorf("backquoted name = %q", got)
	}
}
