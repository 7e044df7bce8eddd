package redisstore

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/rls-project/rls/pkg/testkit"
)

// TestRedisDocInvariants holds docs/redis.md's numbered invariants to the
// code: numbered 1 to N in order, each names a test that exists, and the
// decision path's comments name only invariants that exist.
func TestRedisDocInvariants(t *testing.T) {
	const root = "../../.."
	doc, err := os.ReadFile(filepath.Join(root, "docs/redis.md"))
	if err != nil {
		t.Fatal(err)
	}
	defined, err := testkit.DefinedTests(root)
	if err != nil {
		t.Fatal(err)
	}
	// An invariant is a numbered item, up to the next item or blank line.
	var items [][2]string // number, text
	start := regexp.MustCompile(`^(\d+)\. \*\*`)
	for _, line := range strings.Split(string(doc), "\n") {
		switch m := start.FindStringSubmatch(line); {
		case m != nil:
			items = append(items, [2]string{m[1], line})
		case strings.TrimSpace(line) == "" || len(items) == 0 || !strings.HasPrefix(line, " "):
			if len(items) > 0 && !strings.HasSuffix(items[len(items)-1][1], "\n") {
				items[len(items)-1][1] += "\n"
			}
		case !strings.HasSuffix(items[len(items)-1][1], "\n"):
			items[len(items)-1][1] += " " + line
		}
	}
	if len(items) == 0 {
		t.Fatal("docs/redis.md has no numbered invariants")
	}
	for i, it := range items {
		if it[0] != strconv.Itoa(i+1) {
			t.Errorf("invariant %d is numbered %s", i+1, it[0])
		}
		tests := regexp.MustCompile("`((?:Test|Fuzz)\\w+)`").FindAllStringSubmatch(it[1], -1)
		if len(tests) == 0 {
			t.Errorf("invariant %s names no test", it[0])
		}
		for _, m := range tests {
			if !defined[m[1]] {
				t.Errorf("invariant %s names %s, which no test file defines", it[0], m[1])
			}
		}
	}
	for _, dir := range []string{"pkg/limiter", "pkg/store/redisstore", "pkg/store/redisstore/lua"} {
		files, _ := filepath.Glob(filepath.Join(root, dir, "*"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") || !(strings.HasSuffix(f, ".go") || strings.HasSuffix(f, ".lua")) {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range regexp.MustCompile(`invariants? (\d+)`).FindAllSubmatch(b, -1) {
				if n, _ := strconv.Atoi(string(m[1])); n < 1 || n > len(items) {
					t.Errorf("%s names invariant %d; docs/redis.md has %d", f, n, len(items))
				}
			}
		}
	}
}
