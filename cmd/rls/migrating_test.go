package main

import (
	"bytes"
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/rls-project/rls/pkg/compat"
)

// docs/MIGRATING.md maps every setting of envoyproxy/ratelimit to rls. These
// tests keep it complete and true: its table has a row for each envconfig
// variable of upstream's settings (a committed copy of its settings.go) with
// upstream's default, and every rls flag or RLS_* variable it names exists.

const (
	migratingDoc = "../../docs/MIGRATING.md"
	// upstreamSettings is upstream's src/settings/settings.go behind a
	// header naming its module version; the header ends with headerEnd.
	upstreamSettings = "testdata/envoyproxy-ratelimit/settings.go.txt" // .txt: upstream's code, not ours
	headerEnd        = "// ---- end of header: upstream's file follows unchanged ----\n"
	upstreamModule   = "github.com/envoyproxy/ratelimit"
)

// pendingFlags are flags MIGRATING.md already names that are being added on
// other branches, each with the upstream variable whose row names it ("" for
// none). DELETE each entry when its branch is merged: the test fails naming
// the entries that exist by then.
var pendingFlags = map[string]string{}

// plannedFlags are flags MIGRATING.md names as planned, not in this
// release: they may appear in notes, never as what rls does. When
// one exists, its rows must say how it is used now.
var plannedFlags = map[string]bool{}

// newerUpstreamSettings are the envconfig variables upstream's main branch
// added after the copied version, as of f2fb157 (2026-07-05: the commit
// pkg/descriptors/testdata/upstream comes from, which the Go module proxy
// does not serve), with their defaults. The table covers them too.
var newerUpstreamSettings = []upstreamSetting{
	{"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "false"},
	{"REDIS_CLUSTER_PIPELINE_PARALLELISM", "1"},
	{"REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", "1"},
	{"REDIS_STARTUP_INITIAL_INTERVAL", "1s"},
	{"REDIS_STARTUP_MAX_INTERVAL", "30s"},
	{"REDIS_STARTUP_MAX_ELAPSED_TIME", "0"},
}

// upstreamSetting is one envconfig variable of upstream's Settings.
type upstreamSetting struct {
	name, def string
}

// readUpstreamSettings parses the committed copy of upstream's settings.go:
// every struct field's envconfig tag, in file order, with its default tag,
// and the module version its header names.
func readUpstreamSettings(t *testing.T) (settings []upstreamSetting, version string, body []byte) {
	t.Helper()
	src, err := os.ReadFile(upstreamSettings)
	if err != nil {
		t.Fatal(err)
	}
	header, body, ok := bytes.Cut(src, []byte(headerEnd))
	if !ok {
		t.Fatalf("%s: no line %q ends the header", upstreamSettings, strings.TrimSpace(headerEnd))
	}
	m := regexp.MustCompile(`module version (v\S+)`).FindSubmatch(header)
	if m == nil {
		t.Fatalf("%s: the header names no module version", upstreamSettings)
	}
	version = string(m[1])
	f, err := parser.ParseFile(token.NewFileSet(), upstreamSettings, body, 0)
	if err != nil {
		t.Fatal(err)
	}
	ast.Inspect(f, func(n ast.Node) bool {
		field, ok := n.(*ast.Field)
		if !ok || field.Tag == nil {
			return true
		}
		raw, err := strconv.Unquote(field.Tag.Value)
		if err != nil {
			t.Fatalf("tag %s: %v", field.Tag.Value, err)
		}
		tag := reflect.StructTag(raw)
		if name, ok := tag.Lookup("envconfig"); ok {
			settings = append(settings, upstreamSetting{name: name, def: tag.Get("default")})
		}
		return true
	})
	// Every envconfig tag in the file is a struct field's: none was missed.
	if n := bytes.Count(body, []byte(`envconfig:"`)); n != len(settings) || n == 0 {
		t.Fatalf("%s: %d envconfig tags in the text, %d parsed", upstreamSettings, n, len(settings))
	}
	return settings, version, body
}

// tableRow is one row of MIGRATING.md's table of upstream settings.
type tableRow struct {
	line                    int
	def, rls, compat, notes string
}

// migratingRows returns MIGRATING.md's text and its table rows: the lines
// whose first cell is an upper-case name in backquotes, by name.
func migratingRows(t *testing.T) (string, map[string]tableRow) {
	t.Helper()
	doc, err := os.ReadFile(migratingDoc)
	if err != nil {
		t.Fatal(err)
	}
	rowRE := regexp.MustCompile("^\\| `([A-Z][A-Z0-9_]*)` \\|")
	rows := map[string]tableRow{}
	for i, line := range strings.Split(string(doc), "\n") {
		m := rowRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		cells := splitRow(line)
		if len(cells) != 5 {
			t.Errorf("MIGRATING.md:%d: row `%s` has %d cells, want 5 (variable, upstream default, rls, as `ratelimit`, notes)", i+1, m[1], len(cells))
			continue
		}
		if prev, dup := rows[m[1]]; dup {
			t.Errorf("MIGRATING.md:%d: a second row for `%s` (first at line %d)", i+1, m[1], prev.line)
			continue
		}
		rows[m[1]] = tableRow{line: i + 1, def: cells[1], rls: cells[2], compat: cells[3], notes: cells[4]}
	}
	return string(doc), rows
}

// splitRow splits a Markdown table row into its trimmed cells; `\|` is a
// pipe inside a cell.
func splitRow(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimSuffix(strings.TrimPrefix(line, "|"), "|")
	parts := strings.Split(strings.ReplaceAll(line, `\|`, "\x00"), "|")
	for i, p := range parts {
		parts[i] = strings.TrimSpace(strings.ReplaceAll(p, "\x00", `\|`))
	}
	return parts
}

var (
	// flagRE finds --flag-name (not inside a longer word, not a "---" rule).
	flagRE = regexp.MustCompile(`(?:^|[^A-Za-z0-9_-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)`)
	// twinRE finds RLS_* variable names.
	twinRE = regexp.MustCompile(`\bRLS_[A-Z0-9_]*[A-Z0-9]\b`)
)

// rlsFlags returns the names of rls serve's flags.
func rlsFlags() map[string]bool {
	flags := map[string]bool{}
	newFlagSet(defaultConfig(), &bytes.Buffer{}).VisitAll(func(f *flag.Flag) { flags[f.Name] = true })
	return flags
}

// TestMigratingCoversEveryUpstreamSetting: MIGRATING.md's table has exactly
// one row per envconfig variable of upstream's settings, with upstream's
// default, and each row says what rls does: a flag (with its RLS_* twin in
// the same cell) or why not.
func TestMigratingCoversEveryUpstreamSetting(t *testing.T) {
	settings, _, _ := readUpstreamSettings(t)
	for _, n := range newerUpstreamSettings {
		for _, s := range settings {
			if s.name == n.name {
				t.Errorf("%s is in the copied settings.go now: delete it from newerUpstreamSettings", n.name)
			}
		}
	}
	settings = append(settings, newerUpstreamSettings...)
	_, rows := migratingRows(t)
	flags := rlsFlags()
	known := map[string]bool{}
	for _, s := range settings {
		known[s.name] = true
		row, ok := rows[s.name]
		if !ok {
			t.Errorf("docs/MIGRATING.md's table lacks `%s` (upstream default %q)", s.name, s.def)
			continue
		}
		want := "`" + s.def + "`"
		if s.def == "" {
			want = "empty"
		}
		if row.def != want {
			t.Errorf("MIGRATING.md:%d: `%s`'s upstream default is %s, the table says %s", row.line, s.name, want, row.def)
		}
		named := flagRE.FindAllStringSubmatch(row.rls, -1)
		if len(named) == 0 {
			if !strings.Contains(row.rls, "not supported") && !strings.Contains(row.rls, "not yet supported") && row.rls != "no flag" {
				t.Errorf("MIGRATING.md:%d: `%s`: the rls cell %q names no flag; want a flag, \"no flag\", \"not supported\" or \"not yet supported\"", row.line, s.name, row.rls)
			}
			if row.notes == "" {
				t.Errorf("MIGRATING.md:%d: `%s` has no rls flag and no notes saying why or what to do instead", row.line, s.name)
			}
		}
		for _, m := range named {
			name := m[1]
			if !flags[name] {
				if _, pending := pendingFlags[name]; !pending {
					t.Errorf("MIGRATING.md:%d: `%s`'s rls cell names --%s, which rls does not have", row.line, s.name, name)
				}
			}
			if !strings.Contains(row.rls, "`"+envName(name)+"`") {
				t.Errorf("MIGRATING.md:%d: `%s`'s rls cell names --%s without its twin `%s`", row.line, s.name, name, envName(name))
			}
		}
	}
	for name, row := range rows {
		if !known[name] {
			t.Errorf("MIGRATING.md:%d: the table has a row for `%s`, which is not an upstream setting", row.line, name)
		}
	}
	for name, upstream := range pendingFlags {
		if upstream == "" {
			continue
		}
		if row, ok := rows[upstream]; ok && !strings.Contains(row.rls, "`--"+name+"`") {
			t.Errorf("MIGRATING.md:%d: pending --%s belongs in `%s`'s rls cell", row.line, name, upstream)
		}
	}
}

// TestMigratingCompatColumn: the table's "as `ratelimit`" column says what
// pkg/compat does with each variable when rls runs as ratelimit (read,
// warned, refused), and pkg/compat knows exactly upstream's variables, with
// upstream's defaults.
// kindWords are the words MIGRATING.md's compat column uses for each kind.
var kindWords = map[compat.Kind]string{compat.Read: "read", compat.Warned: "warned", compat.Refused: "refused"}

func TestMigratingCompatColumn(t *testing.T) {
	settings, _, _ := readUpstreamSettings(t)
	settings = append(settings, newerUpstreamSettings...)
	want := map[string]string{}
	for _, s := range settings {
		want[s.name] = s.def
	}
	_, rows := migratingRows(t)
	seen := map[string]bool{}
	for _, v := range compat.Vars {
		seen[v.Name] = true
		def, ok := want[v.Name]
		switch {
		case !ok:
			t.Errorf("pkg/compat reads %s, which is not an upstream setting", v.Name)
		case def != v.Default:
			t.Errorf("pkg/compat's default of %s is %q, upstream's %q", v.Name, v.Default, def)
		}
		if row, ok := rows[v.Name]; ok && row.compat != kindWords[v.Kind] {
			t.Errorf("MIGRATING.md:%d: `%s` is %q as ratelimit, the table says %q", row.line, v.Name, kindWords[v.Kind], row.compat)
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("pkg/compat does not know upstream's %s", name)
		}
	}
}

// TestMigratingNamesOnlyRealFlags: every --flag in MIGRATING.md is one of
// rls's (or pending, or planned in a note), and every RLS_* variable is a
// flag's twin. A pending or planned flag that exists now is reported, so the
// lists shrink as branches merge.
func TestMigratingNamesOnlyRealFlags(t *testing.T) {
	doc, _ := migratingRows(t)
	flags := rlsFlags()
	flags["help"] = true // the flag package's own: rls --help
	twins := map[string]bool{}
	for name := range flags {
		twins[envName(name)] = true
	}
	twins[redisPasswordEnv] = true // the one RLS_* variable without a flag
	for name := range pendingFlags {
		twins[envName(name)] = true
		if flags[name] {
			t.Errorf("--%s exists now: delete it from pendingFlags in migrating_test.go", name)
		}
	}
	for name := range plannedFlags {
		if flags[name] {
			t.Errorf("--%s exists now: MIGRATING.md must say how to use it, not that it is planned; delete it from plannedFlags", name)
		}
	}
	for i, line := range strings.Split(doc, "\n") {
		for _, m := range flagRE.FindAllStringSubmatch(line, -1) {
			name := m[1]
			_, pending := pendingFlags[name]
			if !flags[name] && !pending && !plannedFlags[name] {
				t.Errorf("MIGRATING.md:%d: --%s is not an rls flag", i+1, name)
			}
		}
		for _, v := range twinRE.FindAllString(line, -1) {
			if !twins[v] {
				t.Errorf("MIGRATING.md:%d: %s is not the environment twin of any rls flag", i+1, v)
			}
		}
	}
}

// TestUpstreamSettingsCopy: the committed copy of upstream's settings.go is
// the version scripts/bench.sh runs side by side with rls, and, when the Go
// module cache holds that version (make bench puts it there), identical to
// its file. Without it the comparison is skipped: no test needs the network.
func TestUpstreamSettingsCopy(t *testing.T) {
	_, version, body := readUpstreamSettings(t)
	bench, err := os.ReadFile("../../scripts/bench.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`PEER_VERSION=\$\{BENCH_PEER_VERSION:-(v[^}]+)\}`).FindSubmatch(bench)
	if m == nil {
		t.Fatal("scripts/bench.sh: no PEER_VERSION default found")
	}
	if string(m[1]) != version {
		t.Errorf("%s is from %s, scripts/bench.sh runs %s: copy that version's src/settings/settings.go and check docs/MIGRATING.md against it",
			upstreamSettings, version, m[1])
	}
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Skipf("go env GOMODCACHE: %v", err)
	}
	orig := filepath.Join(strings.TrimSpace(string(out)), upstreamModule+"@"+version, "src", "settings", "settings.go")
	want, err := os.ReadFile(orig)
	if os.IsNotExist(err) {
		t.Skipf("%s@%s is not in the module cache (make bench installs it)", upstreamModule, version)
	}
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(body, want) {
		t.Errorf("%s differs from %s below its header: copy it again", upstreamSettings, orig)
	}
}
