package simulatecmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func simulateCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := Run(context.Background(), args, &out)
	return out.String(), err
}

// TestSimulateHelp: --help lists every flag and the generators, on stdout,
// as a help request (exit 0).
func TestSimulateHelp(t *testing.T) {
	out, err := simulateCmd(t, "--help")
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("rls simulate --help: %v", err)
	}
	newSimulateFlagSet(&simulateFlags{}).VisitAll(func(f *flag.Flag) {
		if !strings.Contains(out, "--"+f.Name+" ") {
			t.Errorf("rls simulate --help does not list --%s", f.Name)
		}
	})
	for _, g := range []string{"poisson:", "onoff:", "boundary:", "standard"} {
		if !strings.Contains(out, g) {
			t.Errorf("rls simulate --help does not explain %s", g)
		}
	}
}

// TestReadmeListsSimulateFlags keeps the rls simulate table of
// docs/algorithms.md true.
func TestReadmeListsSimulateFlags(t *testing.T) {
	readme, err := os.ReadFile("../../docs/algorithms.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(readme), "## `rls simulate`")
	if !ok {
		t.Fatal("docs/algorithms.md has no \"## `rls simulate`\" section")
	}
	sec, _, _ = strings.Cut(sec, "\n#")
	rows := map[string]string{}
	for _, m := range regexp.MustCompile("(?m)^\\| `--([a-z-]+)` \\|([^|]*)\\|").FindAllStringSubmatch(sec, -1) {
		rows[m[1]] = strings.Trim(strings.TrimSpace(m[2]), "`")
	}
	newSimulateFlagSet(&simulateFlags{}).VisitAll(func(f *flag.Flag) {
		def, ok := rows[f.Name]
		if !ok {
			t.Errorf("docs/algorithms.md's rls simulate table lacks --%s", f.Name)
			return
		}
		if f.DefValue != def && !(f.DefValue == "[]" && def == "") && !(f.DefValue == "" && def == "") {
			t.Errorf("docs/algorithms.md says --%s defaults to %q; it is %q", f.Name, def, f.DefValue)
		}
		delete(rows, f.Name)
	})
	for name := range rows {
		t.Errorf("docs/algorithms.md's rls simulate table lists --%s, which does not exist", name)
	}
}

// TestSimulateErrors: each bad input is named.
func TestSimulateErrors(t *testing.T) {
	dir := t.TempDir()
	csv := filepath.Join(dir, "t.csv")
	if err := os.WriteFile(csv, []byte("0.1,api_key=a\n0.2,api_key=a,many\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--limit", "50"}, "no trace"},
		{[]string{"--gen", "poisson"}, "give --config DIR (and --rule) or --limit L"},
		{[]string{"--limit", "50", "--trace", csv}, csv + `:2: hits "many"`},
		{[]string{"--limit", "50", "--trace", filepath.Join(dir, "none.csv")}, "none.csv"},
		{[]string{"--limit", "50", "--gen", "poisson:rate=fast"}, `--gen "poisson:rate=fast": rate=fast`},
		{[]string{"--limit", "50", "--window", "1500ms", "--gen", "poisson"}, "window 1.5s: want a whole number of seconds"},
		{[]string{"--limit", "abc"}, `invalid value "abc" for flag --limit`},
		{[]string{"--limit", "50", "--precisions", "1,10", "--gen", "poisson"}, `--precisions: precision "1"`},
		{[]string{"--rule", "example:api_key=a", "--limit", "5", "--gen", "poisson"}, "--rule and --merge-domains need --config"},
		{[]string{"--config", "../../config", "--limit", "5", "--gen", "poisson"}, "give either --config"},
		{[]string{"--config", "../../config", "--rule", "example:nothing=here", "--gen", "poisson"}, "--rule example:nothing=here: no rule"},
		{[]string{"--config", "../../config", "--rule", "example", "--gen", "poisson"}, `--rule "example": want domain:key=value`},
		{[]string{"--config", "../../config", "--rule", "example:api_key=internal-batch-job", "--gen", "poisson"}, "is unlimited"},
		{[]string{"--config", dir, "--gen", "poisson"}, "no limited rule"},
		{[]string{"--limit", "50", "--gen", "poisson", "extra"}, `unexpected argument "extra"`},
	} {
		_, err := simulateCmd(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("rls simulate %s: %v, want %q", strings.Join(c.args, " "), err, c.want)
		}
	}
}

// TestSimulateConfig runs the command on the shipped config: the rule's
// own algorithm is marked, the CSV's rows of other rules are skipped, and
// the JSON and SVG files are written.
func TestSimulateConfig(t *testing.T) {
	dir := t.TempDir()
	csv := filepath.Join(dir, "t.csv")
	rows := "timestamp,descriptor\n"
	for i := range 40 {
		rows += fmt.Sprintf("1.%02d,api_key=k1,route=/v1/search\n", i)
	}
	rows += "1.5,api_key=k1\n" // the per-api-key rule: skipped
	if err := os.WriteFile(csv, []byte(rows), 0o644); err != nil {
		t.Fatal(err)
	}
	jsonOut, svgOut := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.svg")
	out, err := simulateCmd(t, "--config", "../../config", "--rule", "example:api_key=k1,route=/v1/search",
		"--trace", csv, "--precisions", "10", "--json", jsonOut, "--svg", svgOut)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"40 requests", "limit 5 per 1s", "1 row of the trace skipped", "token_bucket burst=10 *", "sliding_window precision=10", "wrote " + svgOut} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	var doc struct {
		Traces []struct {
			Requests   int
			Candidates []struct{ Name string }
		}
	}
	if b, err := os.ReadFile(jsonOut); err != nil || json.Unmarshal(b, &doc) != nil || len(doc.Traces) != 1 || doc.Traces[0].Requests != 40 {
		t.Errorf("JSON: %v %+v", err, doc)
	}
	if b, err := os.ReadFile(svgOut); err != nil || !bytes.Contains(b, []byte("<svg")) {
		t.Errorf("SVG: %v", err)
	}

	// Several traces: one table each, a summary, one SVG each; --json -
	// prints only the JSON.
	out, err = simulateCmd(t, "--limit", "20", "--window", "2s", "--gen", "standard", "--gen", "poisson:duration=5s", "--svg", svgOut)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(out, "exact sliding log") != 7 || !strings.Contains(out, "peak/L and wrongly denied, per trace") {
		t.Errorf("six traces and a summary, got:\n%s", out)
	}
	for i := 1; i <= 6; i++ {
		if _, err := os.Stat(filepath.Join(dir, fmt.Sprintf("r-%d.svg", i))); err != nil {
			t.Error(err)
		}
	}
	out, err = simulateCmd(t, "--limit", "20", "--gen", "boundary", "--json", "-")
	if err != nil || !json.Valid([]byte(out)) {
		t.Errorf("--json -: %v\n%s", err, out)
	}
}

// TestReadmeSimulateTable keeps the table of docs/algorithms.md true: the
// command shown before it prints it, as its last table.
func TestReadmeSimulateTable(t *testing.T) {
	readme, err := os.ReadFile("../../docs/algorithms.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(readme), "# Choosing an algorithm")
	if !ok {
		t.Fatal("docs/algorithms.md has no \"# Choosing an algorithm\" heading")
	}
	const cmd = "```sh\nrls simulate "
	i := strings.Index(sec, cmd)
	if i < 0 {
		t.Fatal("no rls simulate command in the section")
	}
	line, _, _ := strings.Cut(sec[i+len("```sh\n"):], "\n")
	_, block, ok := strings.Cut(sec, "```\npeak/L and wrongly denied")
	if !ok {
		t.Fatal("no table block after the command")
	}
	block, _, _ = strings.Cut("peak/L and wrongly denied"+block, "```\n")
	out, err := simulateCmd(t, strings.Fields(line)[2:]...)
	if err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	_, table, ok := strings.Cut(out, "\npeak/L and wrongly denied")
	if !ok {
		t.Fatalf("%s printed no summary:\n%s", line, out)
	}
	table = "peak/L and wrongly denied" + table
	if table != block {
		t.Errorf("docs/algorithms.md's table is not what %q prints; it prints:\n%s", line, table)
	}
}
