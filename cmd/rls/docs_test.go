package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/rls-project/rls/internal/simulatecmd"
)

// TestDocBenchmarksShort holds docs/BENCHMARKS.md to the current results
// and the commands (issue 42): the dated history is in docs/bench/.
func TestDocBenchmarksShort(t *testing.T) {
	b, err := os.ReadFile("../../docs/BENCHMARKS.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(b, []byte("\n")); n > 300 {
		t.Errorf("docs/BENCHMARKS.md is %d lines, over 300: history goes to docs/bench/HISTORY.md, tables to docs/bench/RESULTS.md", n)
	}
}

// TestDocBenchmarksGenerated checks that the generated parts of
// docs/BENCHMARKS.md and docs/bench/RESULTS.md are what
// scripts/bench_report.py renders from the raw JSON in docs/bench/: no
// figure in them is edited by hand or left from another run.
func TestDocBenchmarksGenerated(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not on PATH: scripts/bench_report.py cannot run")
	}
	dir := t.TempDir()
	docs := map[string]string{"../../docs/BENCHMARKS.md": filepath.Join(dir, "BENCHMARKS.md"),
		"../../docs/bench/RESULTS.md": filepath.Join(dir, "RESULTS.md")}
	for from, to := range docs {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(py, "../../scripts/bench_report.py", "../../docs/bench",
		docs["../../docs/BENCHMARKS.md"], docs["../../docs/bench/RESULTS.md"])
	cmd.Env = append(os.Environ(), "BENCH_REPORT_PRINT=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("bench_report.py: %v\n%s", err, out)
	}
	for from, to := range docs {
		want, _ := os.ReadFile(from)
		got, _ := os.ReadFile(to)
		if !bytes.Equal(got, want) {
			t.Errorf("%s is not what scripts/bench_report.py renders from docs/bench/*.json: run scripts/bench.sh --report-only", strings.TrimPrefix(from, "../../"))
		}
	}
}

// pendingDocs are files a link may name before they exist (another branch
// adds them). Once a file exists it is checked like any other, and leaves
// this list.
var pendingDocs = map[string]bool{}

// TestDocLinks checks every relative link of README.md and docs/**.md: the
// file exists, and a #fragment names one of its headings (GitHub's
// anchors, or an <a id>), so moving a section cannot leave a link to
// nothing.
func TestDocLinks(t *testing.T) {
	files := docFiles(t, true)
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	links := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, target := range link.FindAllStringSubmatch(string(proseOf(b)), -1) {
			dest := target[1]
			if strings.Contains(dest, "://") || strings.HasPrefix(dest, "mailto:") {
				continue
			}
			links++
			path, frag, _ := strings.Cut(dest, "#")
			file := f
			if path != "" {
				file = filepath.Join(filepath.Dir(f), path)
			}
			rel, _ := filepath.Rel("../..", file)
			name := strings.TrimPrefix(f, "../../")
			if _, err := os.Stat(file); err != nil {
				if !pendingDocs[filepath.ToSlash(rel)] {
					t.Errorf("%s: link %s: %s does not exist", name, dest, rel)
				}
				continue
			}
			if frag == "" || !strings.HasSuffix(file, ".md") {
				continue
			}
			if !anchorsOf(t, file)[frag] {
				t.Errorf("%s: link %s: %s has no heading with the anchor #%s", name, dest, rel, frag)
			}
		}
	}
	if links < 50 {
		t.Errorf("found %d relative links in the docs; the pattern must have broken", links)
	}
}

// proseOf returns md without its fenced code blocks.
func proseOf(md []byte) []byte {
	var out []byte
	fenced := false
	for _, line := range bytes.SplitAfter(md, []byte("\n")) {
		if bytes.HasPrefix(bytes.TrimSpace(line), []byte("```")) {
			fenced = !fenced
			continue
		}
		if !fenced {
			out = append(out, line...)
		}
	}
	return out
}

// anchorsOf returns the anchors GitHub gives the headings of the Markdown
// file: lower case, punctuation but '-' and '_' dropped, spaces to '-',
// "-1", "-2"... after repeats.
func anchorsOf(t *testing.T, file string) map[string]bool {
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`<a id="([^"]+)">`).FindAllSubmatch(b, -1) {
		anchors[string(m[1])] = true
	}
	seen := map[string]int{}
	for _, line := range strings.Split(string(proseOf(b)), "\n") {
		title, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " ")
		if !ok || !strings.HasPrefix(line, "#") {
			continue
		}
		var a strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(title)) {
			switch {
			case r == ' ':
				a.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				a.WriteRune(r)
			}
		}
		s := a.String()
		if n := seen[s]; n > 0 {
			anchors[s+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[s] = true
		}
		seen[s]++
	}
	return anchors
}

// docFiles returns README.md and docs/**.md, with or without the dated
// history (docs/bench/HISTORY.md), which names files and tests of its day.
func docFiles(t *testing.T, history bool) []string {
	files := []string{"../../README.md"}
	err := filepath.WalkDir("../../docs", func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") && (history || !strings.HasSuffix(p, "HISTORY.md")) {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestDocNamesRealFilesAndTests: every repository path the docs show in
// backticks exists, and every test, fuzz target or benchmark they name is
// one (a -run prefix of one, or a name the upstream suite runs).
func TestDocNamesRealFilesAndTests(t *testing.T) {
	var defined []string
	quoted := map[string]bool{}
	err := filepath.WalkDir("../..", func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return err
		}
		b, err := os.ReadFile(p)
		for _, m := range regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Benchmark)\w+)\(`).FindAllSubmatch(b, -1) {
			defined = append(defined, string(m[1]))
		}
		for _, m := range regexp.MustCompile(`"((?:Test|Fuzz|Benchmark)\w+)`).FindAllSubmatch(b, -1) {
			quoted[string(m[1])] = true
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	isTest := func(name string) bool {
		for _, d := range defined {
			if strings.HasPrefix(d, name) {
				return true
			}
		}
		return quoted[name]
	}
	pathRE := regexp.MustCompile("`((?:pkg|cmd|lua|integration|scripts|envoy|deploy|bench|config|examples|proto|docs)/[A-Za-z0-9_./-]*)`")
	testRE := regexp.MustCompile(`\b((?:Test|Fuzz|Benchmark)[A-Z]\w*)`)
	paths, tests := 0, 0
	for _, f := range docFiles(t, false) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(f, "../../")
		for i, line := range strings.Split(string(b), "\n") {
			for _, m := range pathRE.FindAllStringSubmatch(line, -1) {
				paths++
				if _, err := os.Stat("../../" + strings.TrimSuffix(m[1], "/")); err != nil {
					t.Errorf("%s:%d: %s does not exist", name, i+1, m[1])
				}
			}
			for _, m := range testRE.FindAllStringSubmatch(line, -1) {
				tests++
				if !isTest(m[1]) {
					t.Errorf("%s:%d: no test, fuzz target or benchmark %s", name, i+1, m[1])
				}
			}
		}
	}
	if paths < 50 || tests < 50 {
		t.Errorf("found %d paths and %d test names in the docs; the patterns must have broken", paths, tests)
	}
}

// TestDocRedisACL: the ACL docs/redis.md gives rls's Redis user is the one
// TestACLRules (pkg/store/redisstore) runs the store with, rule for rule.
func TestDocRedisACL(t *testing.T) {
	doc, err := os.ReadFile("../../docs/redis.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(doc), "ACL SETUSER rls on >PASSWORD ")
	block, _, _ = strings.Cut(block, "```")
	if !ok {
		t.Fatal("docs/redis.md: no ACL SETUSER rls block")
	}
	documented := strings.Fields(strings.ReplaceAll(block, "\\", " "))
	files, _ := filepath.Glob("../../pkg/store/redisstore/*_test.go")
	var tested []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, lit, ok := strings.Cut(string(b), "\nvar ACLRules = []string{"); ok {
			lit, _, _ = strings.Cut(lit, "}") // the rules hold no brace
			for _, m := range regexp.MustCompile(`"([^"]+)"`).FindAllStringSubmatch(lit, -1) {
				tested = append(tested, m[1])
			}
		}
	}
	if len(tested) == 0 {
		t.Fatal("no var ACLRules in pkg/store/redisstore's tests")
	}
	slices.Sort(documented)
	slices.Sort(tested)
	if !slices.Equal(documented, tested) {
		t.Errorf("docs/redis.md's ACL is not TestACLRules' ACLRules:\n doc:  %v\n test: %v", documented, tested)
	}
}

// otherTools are the flags of other programs that the docs' prose names:
// bench.sh's, ghz's, helm's, redis-cli's and docker's. rls has none of
// them, and the removed flags the docs say are gone.
var otherTools = map[string]bool{"report-only": true, "print-config": true, // scripts/bench.sh
	"insecure": true, "call": true, "connections": true, // ghz
	"set": true, "create-namespace": true, // helm
	"cluster":  true,             // redis-cli --cluster
	"platform": true, "rm": true, // docker
	"admin": true, // removed: docs/operations.md says what replaced it, and that it now fails
}

// TestDocFlags: every --flag the docs give rls (in prose and on rls
// command lines) is one of rls serve's or rls simulate's (or --help,
// --version; --x-* where some flag starts with --x-), and every RLS_*
// variable they name is a flag's twin. docs/flags.md and
// docs/MIGRATING.md, which also name flags that were removed, have tests
// of their own.
func TestDocFlags(t *testing.T) {
	flags := rlsFlags()
	var help strings.Builder
	_ = simulatecmd.Run(context.Background(), []string{"--help"}, &help)
	for _, m := range regexp.MustCompile(`(?m)^  --([a-z0-9-]+) \(default`).FindAllStringSubmatch(help.String(), -1) {
		flags[m[1]] = true
	}
	if len(flags) == len(rlsFlags()) {
		t.Fatal("rls simulate --help lists no flags")
	}
	flags["help"], flags["version"] = true, true
	isFlag := func(name string, rest string) bool {
		if flags[name] || otherTools[name] {
			return true
		}
		if strings.HasPrefix(rest, "-*") { // a family: --redis-tls-*
			for f := range flags {
				if strings.HasPrefix(f, name+"-") {
					return true
				}
			}
		}
		return false
	}
	twins := map[string]bool{redisPasswordEnv: true} // the one RLS_* variable without a flag
	for name := range rlsFlags() {
		twins[envName(name)] = true
	}
	envPrefix := regexp.MustCompile(`^(?:[A-Z_]+=\S+ )*`)
	nflags := 0
	for _, f := range docFiles(t, false) {
		if strings.HasSuffix(f, "/flags.md") || strings.HasSuffix(f, "/MIGRATING.md") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		fenced := false
		for i, line := range strings.Split(string(b), "\n") {
			for _, v := range twinRE.FindAllString(line, -1) {
				if !twins[v] {
					t.Errorf("%s:%d: %s is not the environment twin of any rls flag", strings.TrimPrefix(f, "../../"), i+1, v)
				}
			}
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				fenced = !fenced
				continue
			}
			code := strings.TrimSpace(envPrefix.ReplaceAllString(strings.TrimSpace(line), ""))
			if fenced && !strings.HasPrefix(code, "rls ") && !strings.HasPrefix(code, "go run ./cmd/rls ") {
				continue
			}
			for _, m := range flagRE.FindAllStringSubmatchIndex(line, -1) {
				name := line[m[2]:m[3]]
				nflags++
				if !isFlag(name, line[m[3]:]) {
					t.Errorf("%s:%d: --%s is not an rls flag", strings.TrimPrefix(f, "../../"), i+1, name)
				}
			}
		}
	}
	if nflags < 100 {
		t.Errorf("found %d flags in the docs; the pattern must have broken", nflags)
	}
}

// TestDocReadmeTargets: every make target README.md names is one of the
// Makefile's.
func TestDocReadmeTargets(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([a-z-]+):.*## `).FindAllSubmatch(mk, -1) {
		targets[string(m[1])] = true
	}
	var named []string
	for _, m := range regexp.MustCompile("(?m)(?:`make |^make +)([a-z-]+)").FindAllStringSubmatch(string(b), -1) {
		named = append(named, m[1])
	}
	_, list, ok := strings.Cut(string(b), "`make help` lists\nthe other targets (")
	if !ok {
		t.Error("README.md: no \"`make help` lists the other targets (...)\"")
	}
	list, _, _ = strings.Cut(list, ")")
	for _, m := range regexp.MustCompile("`([a-z-]+)`").FindAllStringSubmatch(list, -1) {
		named = append(named, m[1])
	}
	for _, n := range named {
		if !targets[n] {
			t.Errorf("README.md names make %s, which is not a target of the Makefile", n)
		}
	}
	if len(named) < 15 {
		t.Errorf("found %d make targets in README.md; the patterns must have broken", len(named))
	}
}

// TestDocMetricsExist: every rls_* metric the docs name is one rls
// registers (named in a string of its non-test Go, whole or as the prefix
// of a histogram's series).
func TestDocMetricsExist(t *testing.T) {
	known := map[string]bool{}
	err := filepath.WalkDir("../..", func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		b, err := os.ReadFile(p)
		for _, m := range regexp.MustCompile(`"(rls_[a-z0-9_]+)"`).FindAllSubmatch(b, -1) {
			known[string(m[1])] = true
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// A metric's name; not a release file (rls_vX.Y.Z_..., read as rls_v)
	// or a Function library (rls_<16 hex digits>).
	metricRE := regexp.MustCompile(`\b(rls_[a-z][a-z0-9_]*[a-z])\b`)
	n := 0
	for _, f := range docFiles(t, false) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			for _, m := range metricRE.FindAllStringSubmatch(line, -1) {
				name := m[1]
				if regexp.MustCompile(`^rls_[0-9a-f]{16}$`).MatchString(name) || name == "rls_v" {
					continue
				}
				n++
				base := regexp.MustCompile(`_(bucket|sum|count)$`).ReplaceAllString(name, "")
				if !known[name] && !known[base] {
					t.Errorf("%s:%d: no metric %s in rls's code", strings.TrimPrefix(f, "../../"), i+1, name)
				}
			}
		}
	}
	if n < 30 {
		t.Errorf("found %d metric names in the docs; the pattern must have broken", n)
	}
}

// stringsIn returns the string literals of the first match of re's group
// in the non-test Go files of dir: a table of labels, read from the source
// so that a renamed table fails this test rather than the build.
func stringsIn(t *testing.T, dir string, re *regexp.Regexp) []string {
	files, _ := filepath.Glob(filepath.Join("../..", dir, "*.go"))
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if m := re.FindSubmatch(b); m != nil {
			var out []string
			for _, s := range regexp.MustCompile(`"([^"]*)"`).FindAllSubmatch(m[1], -1) {
				out = append(out, string(s[1]))
			}
			return out
		}
	}
	t.Fatalf("%s: no %s", dir, re)
	return nil
}

// TestDocLabels: where the docs list a metric's or a span attribute's
// values, they list exactly the values the code gives it.
func TestDocLabels(t *testing.T) {
	sources := stringsIn(t, "pkg/limiter", regexp.MustCompile(`\[\.\.\.\]string\{("store"[^}]*)\}`))
	outcomes := stringsIn(t, "pkg/service", regexp.MustCompile(`outcomeNames = \[numOutcomes\]string\{([^}]*)\}`))
	kinds := stringsIn(t, "pkg/telemetry", regexp.MustCompile(`var ErrorKinds = \[\]string\{([^}]*)\}`))
	for _, c := range []struct {
		doc, after, until string
		want              []string
	}{
		{"docs/tracing.md", "| `rls.descriptor.sources` |", "\n", append(slices.Clone(sources), "none")},
		{"docs/tracing.md", "| `rls.descriptor.outcomes` |", "\n", outcomes},
		{"docs/operations.md", "`rls_decisions_total{domain,rule,outcome}` (outcome", "; `rule`", outcomes},
		{"docs/failure.md", "`rls_checks_total{source}`", ")", sources},
		{"docs/failure.md", "`rls_store_errors_total{op,kind}`", ")", kinds},
	} {
		b, err := os.ReadFile("../../" + c.doc)
		if err != nil {
			t.Fatal(err)
		}
		_, list, ok := strings.Cut(string(b), c.after)
		if !ok {
			t.Errorf("%s: no %q", c.doc, c.after)
			continue
		}
		list, _, _ = strings.Cut(list, c.until)
		var got []string
		for _, m := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(list, -1) {
			if !strings.HasPrefix(m[1], "rls_") { // a metric named beside its values
				got = append(got, m[1])
			}
		}
		want := slices.Clone(c.want)
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s lists %v after %q; the code has %v", c.doc, got, c.after, want)
		}
	}
}
