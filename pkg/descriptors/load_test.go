package descriptors

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestOversizedFileIsNotRead: a 50 MB file (sparse, nothing written) is an
// error naming the file, its size and the limit, found without reading it;
// the other files are still read and checked.
func TestOversizedFileIsNotRead(t *testing.T) {
	dir := t.TempDir()
	small := filepath.Join(dir, "a.yaml")
	if err := os.WriteFile(small, []byte("domain: a\ndescriptors: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.yaml")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Truncate(big, 50<<20); err != nil {
		t.Fatal(err)
	}
	reads := map[string]int{}
	orig := readFile
	readFile = func(path string, max int64) ([]byte, error) { reads[path]++; return orig(path, max) }
	t.Cleanup(func() { readFile = orig })

	cfg, _, err := Load(dir, LoadOptions{MaxFileBytesName: "--config-max-bytes"})
	var list Errors
	if cfg != nil || !errors.As(err, &list) || len(list) != 1 {
		t.Fatalf("Load: %v, %v; want one error", cfg, err)
	}
	want := fmt.Sprintf("%s: file is 52428800 bytes, more than the 8388608 bytes of --config-max-bytes; not read", big)
	if list[0].Error() != want {
		t.Errorf("error %q, want %q", list[0].Error(), want)
	}
	if reads[big] != 0 || reads[small] != 1 {
		t.Errorf("reads %v: the big file must not be read, the small one once", reads)
	}
	// A smaller limit applies to the small file too; Load's default does not.
	if _, _, err := Load(dir, LoadOptions{MaxFileBytes: 5}); err == nil || !strings.Contains(err.Error(), "a.yaml: file is 26 bytes, more than the 5 bytes of the size limit") {
		t.Errorf("Load 5 bytes: %v", err)
	}
	os.Remove(big)
	if _, _, err := Load(dir); err != nil {
		t.Errorf("Load without the big file: %v", err)
	}
}

// TestFileGrownAfterStatIsRefused: the size is checked again on what was
// read, so a file that grew after its stat is not parsed past the limit.
func TestFileGrownAfterStatIsRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a.yaml")
	if err := os.WriteFile(path, []byte("domain: a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	orig := readFile
	readFile = func(p string, max int64) ([]byte, error) {
		if err := os.WriteFile(p, []byte("domain: a\ndescriptors: []\n# grown\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return orig(p, max)
	}
	t.Cleanup(func() { readFile = orig })
	_, _, err := Load(dir, LoadOptions{MaxFileBytes: 20})
	if err == nil || !strings.Contains(err.Error(), "file is 21 bytes, more than the 20 bytes") {
		t.Fatalf("Load: %v; want the grown file refused at limit+1 bytes read", err)
	}
}

// TestFingerprint changes with a file's size, mtime or name and ignores
// what Load ignores.
func TestFingerprint(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a.yaml")
	old := time.Now().Add(-time.Hour)
	if err := os.WriteFile(path, []byte("domain: a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(path, old, old)
	fp := func() string {
		t.Helper()
		s, _, err := Fingerprint(dir)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	first := fp()
	if _, newest, _ := Fingerprint(dir); !newest.Equal(old) {
		t.Errorf("newest %v, want %v", newest, old)
	}
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if fp() != first {
		t.Error("a non-YAML file changed the fingerprint")
	}
	os.Chtimes(path, old.Add(time.Second), old.Add(time.Second))
	second := fp()
	if second == first {
		t.Error("a new mtime kept the fingerprint")
	}
	if err := os.WriteFile(path, []byte("domain: b\n"), 0o644); err != nil { // same size
		t.Fatal(err)
	}
	os.Chtimes(path, old.Add(time.Second), old.Add(time.Second))
	if fp() != second {
		t.Error("the fingerprint depends on contents; it must not read them")
	}
	if err := os.Rename(path, filepath.Join(dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
	if fp() == second {
		t.Error("a renamed file kept the fingerprint")
	}
}

// TestLoadUpstreamFiles: with Upstream, the files envoyproxy/ratelimit's
// runtime loader reads are loaded: subdirectories, any name, '.' entries
// (a ConfigMap's timestamped directory included) unless IgnoreDotFiles; a
// link to a directory is skipped, a link to a file read. Without it, only
// the *.yaml files directly in the directory.
func TestLoadUpstreamFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, domain string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("domain: "+domain+"\ndescriptors: []\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "a")
	write("sub/b.conf", "b")
	write(".hidden", "c")
	write("..2026_01_01/d.yaml", "d")
	write("noext", "e")
	if err := os.Symlink("..2026_01_01", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sub/b.conf", filepath.Join(dir, "link.yml")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		opts LoadOptions
		want string
		err  string
	}{
		{LoadOptions{}, "[a b]", ""},                                          // a.yaml, link.yml
		{LoadOptions{Upstream: true, IgnoreDotFiles: true}, "", `domain "b"`}, // sub/b.conf and link.yml
		{LoadOptions{Upstream: true, IgnoreDotFiles: true, MergeDomains: true}, "[a b e]", ""},
		{LoadOptions{Upstream: true, MergeDomains: true}, "[a b c d e]", ""},
	} {
		cfg, notes, err := Load(dir, c.opts)
		switch {
		case c.err != "":
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%+v: %v, want an error with %s", c.opts, err, c.err)
			}
		case err != nil:
			t.Errorf("%+v: %v", c.opts, err)
		case fmt.Sprint(cfg.Domains()) != c.want:
			t.Errorf("%+v: domains %v, want %s (notes %v)", c.opts, cfg.Domains(), c.want, notes)
		}
		if c.opts.Upstream && !strings.Contains(strings.Join(notes, "\n"), "..data: a symbolic link to a directory") && !c.opts.IgnoreDotFiles {
			t.Errorf("%+v: no note on ..data: %v", c.opts, notes)
		}
	}
}
