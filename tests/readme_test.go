package tests

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// walkthroughStep is a README walkthrough command block whose sample
// output follows it.
type walkthroughStep struct {
	command string
	output  []string // the sample output's lines
	line    int      // README line of the command block
}

// walkthroughSteps reads README's Walkthrough: every ```sh block that runs
// the mariadb client and is followed by a bare ``` block (its output).
func walkthroughSteps(t *testing.T) []walkthroughStep {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	i := strings.Index(text, "\n## Walkthrough\n")
	if i < 0 {
		t.Fatal("README has no Walkthrough section")
	}
	startLine := strings.Count(text[:i], "\n") + 2
	lines := strings.Split(text[i+1:], "\n")
	type block struct {
		lang  string
		body  []string
		start int
		end   int
	}
	var blocks []block
	for n := 0; n < len(lines); n++ {
		if n > 0 && strings.HasPrefix(lines[n], "## ") {
			break
		}
		if !strings.HasPrefix(lines[n], "```") {
			continue
		}
		bl := block{lang: strings.TrimPrefix(lines[n], "```"), start: n}
		for n++; n < len(lines) && lines[n] != "```"; n++ {
			bl.body = append(bl.body, lines[n])
		}
		bl.end = n
		blocks = append(blocks, bl)
	}
	var steps []walkthroughStep
	for k := 0; k+1 < len(blocks); k++ {
		cmd, out := blocks[k], blocks[k+1]
		between := strings.TrimSpace(strings.Join(lines[cmd.end+1:out.start], "\n"))
		if cmd.lang != "sh" || out.lang != "" || between != "" || !strings.Contains(strings.Join(cmd.body, "\n"), "mariadb ") {
			continue
		}
		steps = append(steps, walkthroughStep{command: strings.Join(cmd.body, "\n"), output: out.body, line: startLine + cmd.start})
	}
	return steps
}

var numericCell = regexp.MustCompile(`^-?[0-9]+(\.[0-9]+)?$`)

// runServiceAccount makes rgproxy's service account as `make run` does,
// with scripts/service-account.sh (the same grants), under a name of its
// own so that a `make run` on this machine keeps its password, and returns
// the rgproxy flags that use it.
func runServiceAccount(t *testing.T, user string) []string {
	t.Helper()
	pw := t.TempDir() + "/service.password"
	if out, err := exec.Command("bash", "../scripts/service-account.sh", user, pw).CombinedOutput(); err != nil {
		t.Fatalf("scripts/service-account.sh: %v\n%s", err, out)
	}
	return []string{"--admin-user", user, "--admin-password-file", pw}
}

// README's outputs are what the walkthrough's commands print: each mariadb
// command block followed by a sample output is run through the mariadb
// client against a real rgserver and rgproxy (after the walkthrough's load;
// the proxy has a service account, as `make run` gives it) and must print
// the same column headers and the same rows, cell by cell, where numbers,
// which vary from run to run, are masked, and README's proxy address is
// the test's. A sample output that is an ERROR line says the command fails
// with exactly that line.
func TestReadmeOutputsMatchARealRun(t *testing.T) {
	mariadb := requireTool(t, "mariadb", "mariadb-client")
	steps := walkthroughSteps(t)
	if len(steps) < 4 {
		t.Fatalf("README's walkthrough has %d command blocks with a sample output, want the groups', the usage's and the KILL rule's two", len(steps))
	}
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts, runServiceAccount(t, "rgproxy_readme")...)
	_, port, _ := strings.Cut(px.Addr, ":")
	killed := false
	loaded := false
	for _, st := range steps {
		if strings.Contains(st.command, "USAGE") && !loaded {
			// The walkthrough's step 3: the load runs while step 4 looks.
			load := exec.Command(binDir+"/demo-load", "--addr", px.Addr, "--duration", "4s")
			if out, err := load.CombinedOutput(); err != nil {
				t.Fatalf("demo-load: %v\n%s", err, out)
			}
			loaded = true
		}
		cmd := strings.ReplaceAll(st.command, "-P4000", "-P"+port)
		cmd = strings.ReplaceAll(cmd, "mariadb ", mariadb+" ")
		want := make([]string, len(st.output))
		for r, w := range st.output {
			want[r] = strings.ReplaceAll(w, "127.0.0.1:4000", px.Addr)
		}
		fails := len(want) > 0 && strings.HasPrefix(want[0], "ERROR ")
		// rgserver's tables (runaway_queries) fill in the background,
		// batched within 100 ms: a read too early has fewer rows.
		var got []byte
		var real []string
		for deadline := time.Now().Add(5 * time.Second); ; {
			run := exec.Command("bash", "-c", cmd)
			run.Dir = ".."
			start := time.Now()
			var err error
			got, err = run.CombinedOutput()
			if err != nil && !fails {
				t.Fatalf("README line %d: %s\n%v\n%s", st.line, cmd, err, got)
			}
			if err == nil && fails {
				t.Fatalf("README line %d: %s\nsucceeded, README shows %q:\n%s", st.line, cmd, want[0], got)
			}
			t.Logf("README line %d ran in %v:\n%s", st.line, time.Since(start).Round(time.Millisecond), got)
			real = strings.Split(strings.TrimRight(string(got), "\n"), "\n")
			if len(real) >= len(want) || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if len(real) != len(want) {
			t.Errorf("README line %d: %d lines printed, README shows %d:\n%s", st.line, len(real), len(want), got)
			continue
		}
		if fails {
			killed = killed || strings.Contains(want[0], "runaway")
			for r := range real {
				if real[r] != want[r] {
					t.Errorf("README line %d, output line %d: %q, README shows %q", st.line, r+1, real[r], want[r])
				}
			}
			continue
		}
		for r := range real {
			gotCells := strings.Split(real[r], "\t") // the client's batch output
			wantCells := strings.Fields(want[r])
			if len(gotCells) != len(wantCells) {
				t.Errorf("README line %d, output line %d: %d columns printed %q, README shows %d %q", st.line, r+1, len(gotCells), gotCells, len(wantCells), wantCells)
				continue
			}
			for c := range gotCells {
				g, w := gotCells[c], wantCells[c]
				if r > 0 && numericCell.MatchString(g) && numericCell.MatchString(w) {
					continue // a figure of this run
				}
				if g != w {
					what := "cell"
					if r == 0 {
						what = "column header"
					}
					t.Errorf("README line %d, output line %d: %s %d is %q, README shows %q", st.line, r+1, what, c+1, g, w)
				}
			}
		}
	}
	if !killed {
		t.Error("README's walkthrough shows no statement interrupted by a KILL rule")
	}
}
