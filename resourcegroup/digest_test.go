package resourcegroup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestParseDigest(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
		err  string
	}{
		{in: "00ab34cd56ef7890", want: 0x00ab34cd56ef7890},
		{in: "FFFFFFFFFFFFFFFF", want: 0xffffffffffffffff},
		{in: "0000000000000000", want: 0},
		{in: "0x0000000000000a", err: "'x' (U+0078) at character 2"},
		{in: "+000000000000001", err: "'+' (U+002B) at character 1"},
		{in: "00ab34cd56ef789", err: "15 bytes long"},
		{in: "00ab34cd56ef78901", err: "17 bytes long"},
		{in: "00ab34cd56ef789\x00", err: "U+0000 at character 16"},
	} {
		h, err := ParseDigest(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, ErrInvalid) {
				t.Errorf("ParseDigest(%q) = %x, %v; want an ErrInvalid with %q", tc.in, h, err, tc.err)
			}
			continue
		}
		if err != nil || h != tc.want || FormatDigest(h) != strings.ToLower(tc.in) {
			t.Errorf("ParseDigest(%q) = %x, %v; want %x", tc.in, h, err, tc.want)
		}
	}
}

// Digest bindings through Execute and MemStore: created, replaced,
// listed after tags, dropped (a note with IF EXISTS), refused for
// `default`, a missing group and beyond the store's bound.
func TestExecuteDigestBindings(t *testing.T) {
	s := NewMemStore()
	s.MaxDigests = 2
	mustRun(t, s, "CREATE RESOURCE GROUP night RU_PER_SEC = 10")
	mustRun(t, s, "CREATE RESOURCE GROUP other RU_PER_SEC = 10")
	mustRun(t, s, "CREATE RESOURCE GROUP BINDING FOR DIGEST '00AB34CD56EF7890' TO other")
	mustRun(t, s, "CREATE RESOURCE GROUP BINDING FOR DIGEST '00ab34cd56ef7890' TO night") // replaces
	mustRun(t, s, "CREATE RESOURCE GROUP BINDING FOR TAG route = '/r' TO other")
	mustRun(t, s, "ALTER USER 'app'@'%' RESOURCE GROUP other")
	bs, err := s.ListBindings(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(bs), "[{app %    other} {  route /r  other} {    00ab34cd56ef7890 night}]"; got != want {
		t.Errorf("bindings %s, want %s", got, want)
	}

	if _, err := run(t, s, "CREATE RESOURCE GROUP BINDING FOR DIGEST '1111111111111111' TO nope"); !errors.Is(err, ErrNotFound) || err.(*Error).Code != CodeNotFound {
		t.Errorf("binding to a missing group: %v, want 8249", err)
	}
	if _, err := run(t, s, "CREATE RESOURCE GROUP BINDING FOR DIGEST '1111111111111111' TO default"); err == nil || !strings.Contains(err.Error(), "cannot be bound to resource group 'default'") {
		t.Errorf("binding to default: %v", err)
	}
	mustRun(t, s, "CREATE RESOURCE GROUP BINDING FOR DIGEST '1111111111111111' TO night")
	_, err = run(t, s, "CREATE RESOURCE GROUP BINDING FOR DIGEST '2222222222222222' TO night")
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "2 digests are bound already") {
		t.Errorf("a third digest with a bound of 2: %v", err)
	}
	// Replacing a bound digest is not a new one.
	mustRun(t, s, "CREATE RESOURCE GROUP BINDING FOR DIGEST '1111111111111111' TO other")

	mustRun(t, s, "DROP RESOURCE GROUP BINDING FOR DIGEST '00AB34CD56EF7890'")
	if _, err := run(t, s, "DROP RESOURCE GROUP BINDING FOR DIGEST '00ab34cd56ef7890'"); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "digest '00ab34cd56ef7890' has no resource group binding") {
		t.Errorf("DROP of a missing digest binding: %v", err)
	}
	r := mustRun(t, s, "DROP RESOURCE GROUP BINDING IF EXISTS FOR DIGEST '00ab34cd56ef7890'")
	if len(r.Warnings) != 1 || r.Warnings[0].Code != CodeUnknown {
		t.Errorf("DROP IF EXISTS of a missing digest binding: warnings %v", r.Warnings)
	}
	mustRun(t, s, "CREATE RESOURCE GROUP BINDING FOR DIGEST '2222222222222222' TO night") // room again
	bs, _ = s.ListBindings(context.Background())
	if got, want := fmt.Sprint(bs[2:]), "[{    1111111111111111 other} {    2222222222222222 night}]"; got != want {
		t.Errorf("digest bindings %s, want %s", got, want)
	}
	if !RequiresSuper(&CreateDigestBinding{}) || !RequiresSuper(&DropDigestBinding{}) {
		t.Error("digest bindings must need SUPER")
	}
}
