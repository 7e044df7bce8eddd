package descriptors

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/rls-project/rls/pkg/store"
)

// loadErrors loads dir and returns its validation errors, failing the test
// when Load succeeds or fails otherwise.
func loadErrors(t *testing.T, dir string) Errors {
	t.Helper()
	cfg, _, err := Load(dir)
	if err == nil {
		t.Fatalf("Load(%s) succeeded, want validation errors", dir)
	}
	if cfg != nil {
		t.Errorf("Load(%s) returned a config with its errors", dir)
	}
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Load(%s) error %T %v, want Errors", dir, err, err)
	}
	return errs
}

// mustParse parses one YAML file named name, failing the test on error.
func mustParse(t *testing.T, name, yaml string) *Config {
	t.Helper()
	cfg, err := Parse(map[string][]byte{name: []byte(yaml)})
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return cfg
}

func TestLoadInvalid(t *testing.T) {
	tests := []struct {
		dir   string
		file  string // base name; config.yaml when empty
		line  int
		field string
		msg   string // substring of the message
	}{
		{dir: "unknown_field_root", line: 2, field: "foo", msg: "unknown field"},
		{dir: "unknown_field_descriptor", line: 4, field: "limit", msg: "unknown field"},
		{dir: "unknown_field_rate_limit", line: 7, field: "burts", msg: "unknown field"},
		{dir: "unknown_field_replaces", line: 9, field: "why", msg: "unknown field"},
		{dir: "missing_domain", line: 1, field: "domain", msg: "missing"},
		{dir: "empty_domain", line: 1, field: "domain", msg: "must not be empty"},
		{dir: "duplicate_domain", file: "b.yaml", line: 2, field: "domain", msg: `duplicate domain "api", also defined at testdata/invalid/duplicate_domain/a.yaml:1`},
		{dir: "missing_key", line: 3, field: "key", msg: "missing"},
		{dir: "empty_key", line: 3, field: "key", msg: "must not be empty"},
		{dir: "duplicate_key_value", line: 7, field: "value", msg: "duplicate descriptor"},
		{dir: "duplicate_key_only", line: 7, field: "key", msg: "duplicate descriptor"},
		{dir: "duplicate_field", line: 4, field: "key", msg: "duplicate field"},
		{dir: "bad_unit", line: 5, field: "unit", msg: `invalid unit "fortnight"`},
		{dir: "missing_unit", line: 4, field: "unit", msg: "missing"},
		{dir: "unit_multiplier_zero", line: 6, field: "unit_multiplier", msg: "must be at least 1"},
		{dir: "unit_multiplier_negative", line: 6, field: "unit_multiplier", msg: "negative"},
		{dir: "unit_multiplier_over_a_year", line: 7, field: "unit_multiplier", msg: "13 with unit month is a window of 390 days, longer than one year"},
		{dir: "unlimited_with_unit_multiplier", line: 6, field: "unit_multiplier", msg: "unlimited"},
		{dir: "unlimited_with_unit", line: 6, field: "unit", msg: "unlimited"},
		{dir: "unlimited_with_requests_per_unit", line: 6, field: "requests_per_unit", msg: "unlimited"},
		{dir: "replaces_own_name", line: 10, field: "replaces", msg: "own name"},
		{dir: "replaces_missing_name", line: 8, field: "replaces", msg: "no name"},
		{dir: "replaces_empty_name", line: 8, field: "replaces", msg: "empty name"},
		{dir: "burst_without_token_bucket", line: 8, field: "burst", msg: "token_bucket"},
		{dir: "burst_zero", line: 8, field: "burst", msg: "at least 1"},
		{dir: "unknown_algorithm", line: 7, field: "algorithm", msg: "leaky_bucket"},
		{dir: "unknown_on_error", line: 7, field: "on_error", msg: "retry"},
		{dir: "requests_per_unit_negative", line: 6, field: "requests_per_unit", msg: "negative"},
		{dir: "requests_per_unit_fraction", line: 6, field: "requests_per_unit", msg: "integer"},
		{dir: "requests_per_unit_word", line: 6, field: "requests_per_unit", msg: "integer"},
		{dir: "requests_per_unit_too_large", line: 6, field: "requests_per_unit", msg: "too large"},
		{dir: "syntax_error", line: 3, field: "", msg: "YAML syntax"},
		{dir: "not_a_mapping", line: 1, field: "", msg: "must be a mapping"},
		{dir: "empty_file", line: 1, field: "domain", msg: "empty"},
		{dir: "two_documents", line: 2, field: "", msg: "more than one YAML document"},
		{dir: "descriptors_not_a_list", line: 3, field: "descriptors", msg: "must be a list"},
		{dir: "bad_bool", line: 4, field: "shadow_mode", msg: "true or false"},
		{dir: "share_threshold_without_wildcard", line: 5, field: "share_threshold", msg: "wildcard"},
		{dir: "metadata_too_large", line: 5, field: "metadata", msg: "5015 bytes (encoded, as the response's dynamic metadata carries it), over the limit of 4096 per descriptor"},
	}
	seen := map[string]bool{}
	for _, tt := range tests {
		seen[tt.dir] = true
		t.Run(tt.dir, func(t *testing.T) {
			dir := filepath.Join("testdata", "invalid", tt.dir)
			errs := loadErrors(t, dir)
			if len(errs) != 1 {
				t.Fatalf("got %d errors, want 1:\n%v", len(errs), errs)
			}
			e := errs[0]
			file := tt.file
			if file == "" {
				file = "config.yaml"
			}
			if want := filepath.Join(dir, file); e.File != want || e.Line != tt.line || e.Field != tt.field {
				t.Errorf("got %s:%d field %q, want %s:%d field %q (%v)", e.File, e.Line, e.Field, want, tt.line, tt.field, e)
			}
			if !strings.Contains(e.Msg, tt.msg) {
				t.Errorf("message %q does not contain %q", e.Msg, tt.msg)
			}
			var ce *ConfigError
			if _, _, err := Load(dir); !errors.As(err, &ce) || ce != e && ce.Line != e.Line {
				t.Errorf("errors.As(*ConfigError) failed on %v", err)
			}
		})
	}
	// Every fixture directory has a case (except the multi-error one).
	dirs, err := os.ReadDir(filepath.Join("testdata", "invalid"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if !seen[d.Name()] && d.Name() != "many_errors" {
			t.Errorf("fixture testdata/invalid/%s has no test case", d.Name())
		}
	}
}

func TestLoadCollectsAllErrors(t *testing.T) {
	dir := filepath.Join("testdata", "invalid", "many_errors")
	errs := loadErrors(t, dir)
	a, b := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	want := []struct {
		file  string
		line  int
		field string
	}{
		{a, 5, "unit"},
		{a, 6, "requests_per_unit"},
		{a, 7, "key"},
		{b, 2, "typo"},
		{b, 7, "unit"},
	}
	if len(errs) != len(want) {
		t.Fatalf("got %d errors, want %d:\n%v", len(errs), len(want), errs)
	}
	for i, w := range want {
		if e := errs[i]; e.File != w.file || e.Line != w.line || e.Field != w.field {
			t.Errorf("error %d = %v, want %s:%d field %s", i, e, w.file, w.line, w.field)
		}
	}
	if got := strings.Count(errs.Error(), "\n"); got != len(want)-1 {
		t.Errorf("Errors.Error() has %d newlines, want %d", got, len(want)-1)
	}
}

func TestConfigErrorString(t *testing.T) {
	tests := []struct {
		name string
		err  *ConfigError
		want string
	}{
		{"full", &ConfigError{File: "a.yaml", Line: 3, Field: "unit", Msg: "bad"}, "a.yaml:3: unit: bad"},
		{"no field", &ConfigError{File: "a.yaml", Line: 3, Msg: "bad"}, "a.yaml:3: bad"},
		{"no line", &ConfigError{File: "a.yaml", Msg: "bad"}, "a.yaml: bad"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.Error(); got != tt.want {
				t.Errorf("Error() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestLoadEnvoyRatelimitExample(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "envoy-ratelimit-example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := mustParse(t, "example.yaml", string(data))
	if got := cfg.Domains(); !reflect.DeepEqual(got, []string{"rl"}) {
		t.Fatalf("Domains() = %v", got)
	}
	tests := []struct {
		name      string
		entries   []string
		rpu       uint32
		unit      Unit
		unlimited bool
		shadow    bool
		nilRule   bool
	}{
		{name: "nested exact", entries: []string{"source_cluster", "proxy", "destination_cluster", "mock"}, rpu: 1, unit: UnitMinute},
		{name: "nested exact, other value", entries: []string{"source_cluster", "proxy", "destination_cluster", "other"}, nilRule: true},
		{name: "parent without limit", entries: []string{"source_cluster", "proxy"}, nilRule: true},
		{name: "key only", entries: []string{"foo", "anything"}, rpu: 2, unit: UnitMinute},
		{name: "child default", entries: []string{"foo", "x", "bar", "y"}, rpu: 3, unit: UnitMinute},
		{name: "child exact zero", entries: []string{"foo", "x", "bar", "banned"}, rpu: 0, unit: UnitMinute},
		{name: "second unit", entries: []string{"foo", "x", "baz", "y"}, rpu: 1, unit: UnitSecond},
		{name: "shadow", entries: []string{"foo", "x", "baz", "shady"}, rpu: 1, unit: UnitMinute, shadow: true},
		{name: "unlimited child", entries: []string{"foo", "x", "bay", "y"}, unlimited: true},
		{name: "unlimited top", entries: []string{"qux", "y"}, unlimited: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := cfg.Match("rl", entries(tt.entries...))
			if tt.nilRule {
				if r != nil {
					t.Fatalf("Match = %+v, want nil", r)
				}
				return
			}
			if r == nil {
				t.Fatal("Match = nil")
			}
			if r.RequestsPerUnit != tt.rpu || r.Unit != tt.unit || r.Unlimited != tt.unlimited || r.ShadowMode != tt.shadow {
				t.Errorf("Match = %+v", r)
			}
		})
	}
}

func TestParseRuleFields(t *testing.T) {
	cfg, _, err := Load(filepath.Join("testdata", "match"))
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*Rule{}
	for _, r := range cfg.Rules() {
		byName[r.Name] = r
	}
	file := filepath.Join("testdata", "match", "api.yaml")
	tests := []struct {
		name string
		want Rule
	}{
		{"per_key", Rule{Name: "per_key", Unit: UnitMinute, RequestsPerUnit: 100, Domain: "api", Path: "api_key", statsPath: "api_key", File: file, Line: 5}},
		{"v1", Rule{Name: "v1", Unit: UnitSecond, RequestsPerUnit: 10, Algorithm: store.TokenBucket, Burst: 20,
			OnError: OnErrorFailClosed, Domain: "api", Path: "api_key/route=/v1/*", statsPath: "api_key.route_/v1/*", File: file, Line: 9}},
		{"admin", Rule{Name: "admin", Unit: UnitSecond, RequestsPerUnit: 1, Replaces: []string{"per_key"},
			Domain: "api", Path: "api_key/route=/v1/admin", statsPath: "api_key.route_/v1/admin", File: file, Line: 18}},
		{"v2_items", Rule{Name: "v2_items", Unit: UnitHour, RequestsPerUnit: 5, Algorithm: store.FixedWindow,
			Domain: "api", Path: "api_key/route=/v2/*/items/*", statsPath: "api_key.route_/v2/*/items/*", File: file, Line: 21}},
		{"any_route", Rule{Name: "any_route", Unit: UnitMinute, RequestsPerUnit: 50, OnError: OnErrorFailOpen,
			Domain: "api", Path: "api_key/route", statsPath: "api_key.route", File: file, Line: 23}},
		{"method_path", Rule{Name: "method_path", Unit: UnitDay, RequestsPerUnit: 1000,
			Domain: "api", Path: "api_key/method/path", statsPath: "api_key.method.path", File: file, Line: 27}},
		{"shadowed", Rule{Name: "shadowed", Unit: UnitWeek, RequestsPerUnit: 3, ShadowMode: true, DetailedMetric: true,
			Domain: "api", Path: "shadow", statsPath: "shadow", File: file, Line: 42}},
		{"free", Rule{Name: "free", Unlimited: true, QuotaMode: true, Domain: "api", Path: "free", statsPath: "free", File: file, Line: 45}},
		{"eng_shared", Rule{Name: "eng_shared", Unit: UnitMinute, RequestsPerUnit: 7, Domain: "api", Path: "team=eng-*", statsPath: "team_eng-*",
			File: file, Line: 50, share: []string{"eng-*"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := byName[tt.name]
			if got == nil {
				t.Fatalf("no rule %q", tt.name)
			}
			if !reflect.DeepEqual(*got, tt.want) {
				t.Errorf("rule\n got %+v\nwant %+v", *got, tt.want)
			}
		})
	}
	if len(cfg.Rules()) != 13 {
		t.Errorf("Rules() has %d rules, want 13", len(cfg.Rules()))
	}
}

func TestParseYAMLFeatures(t *testing.T) {
	const doc = `
domain: anchors
descriptors:
  - key: a
    rate_limit: &std {unit: MINUTE, requests_per_unit: 0x10}
  - key: b
    rate_limit: *std
  - key: c
    shadow_mode: yes
    rate_limit:
      <<: *std
      requests_per_unit: 3
  - key: d
    value: ~
    rate_limit: {unit: second, requests_per_unit: 1}
`
	cfg := mustParse(t, "anchors.yaml", doc)
	tests := []struct {
		key    string
		rpu    uint32
		unit   Unit
		shadow bool
	}{
		{"a", 16, UnitMinute, false},
		{"b", 16, UnitMinute, false},
		{"c", 3, UnitMinute, true},
		{"d", 1, UnitSecond, false},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			r := cfg.Match("anchors", entries(tt.key, "v"))
			if r == nil || r.RequestsPerUnit != tt.rpu || r.Unit != tt.unit || r.ShadowMode != tt.shadow {
				t.Errorf("Match = %+v", r)
			}
		})
	}
}

func TestLoadDirectory(t *testing.T) {
	cfg, ignored, err := Load(filepath.Join("testdata", "load"))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Domains(); !reflect.DeepEqual(got, []string{"api", "web"}) {
		t.Errorf("Domains() = %v", got)
	}
	want := []string{
		"ignoring testdata/load/.hidden.yaml: hidden entry",
		"ignoring testdata/load/README.md: not a .yaml or .yml file",
		"ignoring testdata/load/nested: directory",
	}
	if !reflect.DeepEqual(ignored, want) {
		t.Errorf("ignored =\n%q\nwant\n%q", ignored, want)
	}
	if len(cfg.Hash()) != 64 {
		t.Errorf("Hash() = %q, want 64 hex digits", cfg.Hash())
	}
}

// TestLoadConfigMapLayout loads a directory laid out like a Kubernetes
// ConfigMap volume: the files are symbolic links through "..data".
func TestLoadConfigMapLayout(t *testing.T) {
	dir := t.TempDir()
	version := filepath.Join(dir, "..2026_01_01_00_00_00.000000001")
	if err := os.Mkdir(version, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{
		"api.yaml": "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
		"web.yaml": "domain: web\n",
	} {
		if err := os.WriteFile(filepath.Join(version, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	symlink(t, filepath.Base(version), filepath.Join(dir, "..data"))
	symlink(t, filepath.Join("..data", "api.yaml"), filepath.Join(dir, "api.yaml"))
	symlink(t, filepath.Join("..data", "web.yaml"), filepath.Join(dir, "web.yaml"))

	cfg, ignored, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Domains(); !reflect.DeepEqual(got, []string{"api", "web"}) {
		t.Errorf("Domains() = %v", got)
	}
	if len(ignored) != 2 {
		t.Errorf("ignored = %q, want the two '..' entries", ignored)
	}
	if r := cfg.Match("api", entries("k", "v")); r == nil || r.File != filepath.Join(dir, "api.yaml") {
		t.Errorf("Match = %+v", r)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Skipf("symlinks unavailable: %v", err)
	}
}

func TestLoadMissingDirectory(t *testing.T) {
	_, _, err := Load(filepath.Join("testdata", "no-such-dir"))
	var errs Errors
	if err == nil || errors.As(err, &errs) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing) = %v, want a wrapped not-exist error", err)
	}
}

func TestHash(t *testing.T) {
	a := map[string][]byte{"a.yaml": []byte("domain: a\n"), "b.yaml": []byte("domain: b\n")}
	b := map[string][]byte{"b.yaml": []byte("domain: b\n"), "a.yaml": []byte("domain: a\n")}
	c := map[string][]byte{"a.yaml": []byte("domain: a\n"), "b.yaml": []byte("domain: bb\n")}
	ca, _ := Parse(a)
	cb, _ := Parse(b)
	cc, _ := Parse(c)
	if ca.Hash() != cb.Hash() {
		t.Error("same files give different hashes")
	}
	if ca.Hash() == cc.Hash() {
		t.Error("different files give the same hash")
	}
}

// yamlLines returns an upper bound of the lines of data as YAML counts them
// (line feeds, carriage returns, NEL, LS and PS break lines).
func yamlLines(data []byte) int {
	n := 1
	for _, sep := range []string{"\n", "\r", "\u0085", "\u2028", "\u2029"} {
		n += bytes.Count(data, []byte(sep))
	}
	return n
}

// FuzzParse checks that Parse never panics, that every error it returns
// names file:line (a line of the input) and that a config it accepts
// answers Match.
func FuzzParse(f *testing.F) {
	for _, dir := range []string{"match", "load"} {
		files, _ := filepath.Glob(filepath.Join("testdata", dir, "*.y*ml"))
		for _, name := range files {
			data, err := os.ReadFile(name)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	invalid, _ := filepath.Glob(filepath.Join("testdata", "invalid", "*", "*.y*ml"))
	for _, name := range invalid {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("domain: x\ndescriptors:\n  - &a {key: k, descriptors: [*a]}\n"))
	f.Add([]byte("domain: x\x01\n"))    // a control character
	f.Add([]byte("domain: \xff\xfe\n")) // invalid UTF-8
	f.Add([]byte("\n\n\t- key\n"))      // a tab in indentation
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(map[string][]byte{"f.yaml": data})
		if err != nil {
			var errs Errors
			if !errors.As(err, &errs) || len(errs) == 0 {
				t.Fatalf("error %v is not a non-empty Errors", err)
			}
			// Every error names file:line.
			for _, e := range errs {
				if e == nil || e.File != "f.yaml" || e.Line <= 0 || !strings.HasPrefix(e.Error(), fmt.Sprintf("f.yaml:%d: ", e.Line)) {
					t.Fatalf("error %q does not start with f.yaml:<line>: (%+v)\ninput %q", e, e, data)
				}
				if lines := yamlLines(data); e.Line > lines {
					t.Fatalf("error %q names line %d of a %d-line file\ninput %q", e, e.Line, lines, data)
				}
			}
			return
		}
		for _, d := range cfg.Domains() {
			cfg.Match(d, entries("k", "v", "k2", "v2"))
		}
	})
}
