package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/rls-project/rls/pkg/buildinfo"
)

// upstreamFixtures are envoyproxy/ratelimit's config files, copied for
// pkg/descriptors' replay of its tests (see the README there).
var upstreamFixtures = filepath.Join("..", "..", "pkg", "descriptors", "testdata", "upstream")

// runValidate runs `rls validate args...` and returns what it printed.
func runValidate(args ...string) (string, error) {
	var out, errOut bytes.Buffer
	err := run(context.Background(), append([]string{"validate"}, args...), func(string) string { return "" }, &out, &errOut)
	return out.String() + errOut.String(), err
}

// upstreamDir copies files of upstream's test/config into a new directory.
func upstreamDir(t *testing.T, files ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(upstreamFixtures, "test_config", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestValidateUpstreamConfigs: rls validate accepts envoyproxy/ratelimit's
// examples, and its pair of files for one domain with --merge-domains only;
// it refuses each file upstream's tests expect to panic with a
// file:line: error for it.
func TestValidateUpstreamConfigs(t *testing.T) {
	out, err := runValidate(filepath.Join(upstreamFixtures, "examples"))
	if err != nil || !strings.Contains(out, "ok, 2 domain(s) [mongo_cps rl]") {
		t.Errorf("validate examples: %v\n%s", err, out)
	}

	dir := upstreamDir(t, "merge_domain_key1.yaml", "merge_domain_key2.yaml")
	if out, err := runValidate(dir); err == nil || !strings.Contains(out, "merge_domain_key2.yaml:2: domain: duplicate domain") {
		t.Errorf("validate merge pair without --merge-domains: %v\n%s", err, out)
	}
	if out, err := runValidate("--merge-domains", dir); err != nil || !strings.Contains(out, "ok, 1 domain(s) [test-domain]") {
		t.Errorf("validate --merge-domains merge pair: %v\n%s", err, out)
	}

	for _, f := range []string{
		"bad_limit_unit.yaml", "bad_yaml.yaml", "duplicate_key.yaml", "empty_domain.yaml",
		"empty_key.yaml", "misspelled_key.yaml", "misspelled_key2.yaml", "non_map_list.yaml",
		"non_string_key.yaml", "replaces_empty.yaml", "replaces_self.yaml", "unlimited_with_unit.yaml",
	} {
		dir := upstreamDir(t, f)
		out, err := runValidate(dir)
		at := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(filepath.Join(dir, f)) + `:[1-9][0-9]*: `)
		if err == nil || !at.MatchString(out) {
			t.Errorf("validate %s: %v; want a %s:LINE: error, got\n%s", f, err, f, out)
		}
	}
	dir = upstreamDir(t, "bad_limit_unit.yaml")
	if out, _ := runValidate(dir); !strings.Contains(out, filepath.Join(dir, "bad_limit_unit.yaml")+`:6: unit: invalid unit "foo"`) {
		t.Errorf("validate bad_limit_unit.yaml:\n%s", out)
	}
}

// TestValidateSplit: rls validate accepts a split hot key and names every
// bad split value with its file and line (README, "Hot keys: split").
func TestValidateSplit(t *testing.T) {
	dir := t.TempDir()
	good := "domain: hot\ndescriptors:\n  - key: tenant\n    value: big\n    rate_limit: {unit: second, requests_per_unit: 50000, split: 3}\n"
	if err := os.WriteFile(filepath.Join(dir, "hot.yaml"), []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := runValidate(dir); err != nil {
		t.Fatalf("split: 3 refused: %v\n%s", err, out)
	}
	bad := `domain: bad
descriptors:
  - key: zero
    rate_limit: {unit: second, requests_per_unit: 100, split: 0}
  - key: many
    rate_limit: {unit: second, requests_per_unit: 50000, split: 65}
  - key: half
    rate_limit: {unit: second, requests_per_unit: 100, split: 2.5}
  - key: word
    rate_limit: {unit: second, requests_per_unit: 100, split: all}
  - key: small
    rate_limit: {unit: second, requests_per_unit: 2, split: 3}
  - key: free
    rate_limit: {unlimited: true, split: 3}
`
	if err := os.WriteFile(filepath.Join(dir, "bad.yaml"), []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runValidate(dir)
	if err == nil {
		t.Fatalf("bad splits accepted:\n%s", out)
	}
	for _, want := range []string{
		"bad.yaml:4: split: must be 1 to 64 sub-keys, got 0",
		"bad.yaml:6: split: must be 1 to 64 sub-keys, got 65",
		"bad.yaml:8: split: must be an integer, got 2.5",
		`bad.yaml:10: split: must be a non-negative integer, got the scalar "all"`,
		"bad.yaml:12: split: 3 sub-keys for requests_per_unit 2: each sub-key needs a share of at least 1",
		"bad.yaml:14: split: must not be set when unlimited is true",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("rls validate does not say %q:\n%s", want, out)
		}
	}
}

// TestVersion: rls version, and rls --version, print the release's
// ldflags.
func TestVersion(t *testing.T) {
	old := [3]string{buildinfo.Version, buildinfo.Commit, buildinfo.Date}
	t.Cleanup(func() { buildinfo.Version, buildinfo.Commit, buildinfo.Date = old[0], old[1], old[2] })
	buildinfo.Version, buildinfo.Commit, buildinfo.Date = "v1.2.3", "0123abc", "2026-12-02T15:00:00Z"
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), args, func(string) string { return "" }, &out, &errOut)
		if err != nil || !strings.HasPrefix(out.String(), "rls v1.2.3 commit 0123abc built 2026-12-02T15:00:00Z go") {
			t.Errorf("rls %v = %q, %v", args, out.String(), err)
		}
	}
}

// TestValidateBucketUnreachable: a rule no RLQS BucketId reaches is a note
// naming its file, line and path; validate still succeeds, since
// ShouldRateLimit reaches it.
func TestValidateBucketUnreachable(t *testing.T) {
	dir := t.TempDir()
	yaml := `domain: d
descriptors:
  - key: a
    descriptors:
      - key: a
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 1}
`
	if err := os.WriteFile(filepath.Join(dir, "d.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runValidate(dir)
	if err != nil {
		t.Fatalf("validate: %v\n%s", err, out)
	}
	if !strings.Contains(out, "d.yaml:5: rule a > a: no RLQS BucketId reaches it") || !strings.Contains(out, "ok, 1 domain(s) [d]") {
		t.Errorf("validate output lacks the note or the ok line:\n%s", out)
	}
	if strings.Contains(out, "rule b:") {
		t.Errorf("a reachable rule is reported:\n%s", out)
	}
}

// TestValidateUpstreamFiles: rls validate in upstream mode (the flag, or
// its twin as ratelimit) loads what serve loads then: a file in a
// subdirectory without a .yaml name, which plain rls validate skips.
func TestValidateUpstreamFiles(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sub", "limits"), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: parsec}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := validate([]string{dir}, envOf(nil), &out); err == nil || !strings.Contains(out.String(), "ignoring "+filepath.Join(dir, "sub")) {
		t.Errorf("plain validate: %v\n%s", err, out.String())
	}
	for _, c := range []struct {
		args []string
		env  map[string]string
	}{{[]string{"--env-compat", "upstream", dir}, nil}, {[]string{dir}, map[string]string{"RLS_ENV_COMPAT": "upstream"}}} {
		out.Reset()
		if err := validate(c.args, envOf(c.env), &out); err == nil || !strings.Contains(out.String(), filepath.Join(dir, "sub", "limits")+":4") {
			t.Errorf("%v %v: %v, want the unit error of sub/limits:\n%s", c.args, c.env, err, out.String())
		}
	}
}
