package descriptors

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rls-project/rls/pkg/store"
)

// DefaultMaxFileBytes is the largest config file Load reads: 8 MiB, eight
// times what a Kubernetes ConfigMap can hold.
const DefaultMaxFileBytes = 8 << 20

// LoadOptions tune Load. Zero fields take the defaults in brackets.
type LoadOptions struct {
	// MaxFileBytes is the largest file read [DefaultMaxFileBytes]: a larger
	// one is an error naming its size, found from its metadata before any
	// of it is read or parsed.
	MaxFileBytes int64
	// MaxFileBytesName is how that error names the limit, e.g. the flag
	// that sets it ["the size limit"].
	MaxFileBytesName string
	// MergeDomains lets several files define one domain, and
	// MergeDomainsName names that option in errors (see ParseOptions).
	MergeDomains     bool
	MergeDomainsName string
	// DefaultAlgorithm is the algorithm of rules that name none [sliding
	// window] (see ParseOptions).
	DefaultAlgorithm store.Algorithm
	// Global allows rules of scope: global (see ParseOptions).
	Global bool
	// AllowEmpty lets LoadDir take a directory without any domain, and
	// AllowEmptyName names that option in its error.
	AllowEmpty     bool
	AllowEmptyName string
	// Upstream loads the files envoyproxy/ratelimit's runtime loader
	// loads (scanUpstream): every file under the directory, subdirectories
	// included, whatever its name; IgnoreDotFiles (its
	// RUNTIME_IGNOREDOTFILES) skips the entries whose names begin with
	// '.' there. Without Upstream only the *.yaml and *.yml files directly
	// in the directory are read, never a '.' entry.
	Upstream, IgnoreDotFiles bool
}

// parseOptions are the options of parsing what was loaded.
func (o LoadOptions) parseOptions() ParseOptions {
	return ParseOptions{MergeDomains: o.MergeDomains, MergeDomainsName: o.MergeDomainsName, DefaultAlgorithm: o.DefaultAlgorithm, Global: o.Global}
}

// readFile reads at most max+1 bytes of path (a file may grow after its
// size was checked). A variable so tests can count reads.
var readFile = func(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, max+1))
}

// candidate is a file Load would read, with its metadata (symbolic links
// followed).
type candidate struct {
	path string
	fi   os.FileInfo
}

// scan lists the files of dir that Load reads with opts, the entries it
// ignores (one line each) and the errors of entries it cannot stat.
func scan(dir string, opts LoadOptions) (files []candidate, ignored []string, errs Errors, err error) {
	if opts.Upstream {
		return scanUpstream(dir, opts.IgnoreDotFiles)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("load %s: %w", dir, err)
	}
	for _, e := range entries {
		name := e.Name()
		path := filepath.Join(dir, name)
		if strings.HasPrefix(name, ".") {
			ignored = append(ignored, fmt.Sprintf("ignoring %s: hidden entry", path))
			continue
		}
		fi, err := os.Stat(path) // follows symbolic links
		if err != nil {
			errs = append(errs, &ConfigError{File: path, Msg: err.Error()})
			continue
		}
		if fi.IsDir() {
			ignored = append(ignored, fmt.Sprintf("ignoring %s: directory", path))
			continue
		}
		switch strings.ToLower(filepath.Ext(name)) {
		case ".yaml", ".yml":
		default:
			ignored = append(ignored, fmt.Sprintf("ignoring %s: not a .yaml or .yml file", path))
			continue
		}
		files = append(files, candidate{path, fi})
	}
	return files, ignored, errs, nil
}

// scanUpstream lists the files envoyproxy/ratelimit's runtime loader
// (lyft/goruntime's, which walks the directory) reads under dir: every
// file in it and its subdirectories, whatever its name, and a symbolic
// link as the file it points at. A link to a directory is skipped, as
// upstream's walk, which does not follow it, fails to read it (a
// Kubernetes ConfigMap's "..data"); names beginning with '.' are skipped,
// directories with all they hold, only with ignoreDot. dir itself may be
// a link.
func scanUpstream(dir string, ignoreDot bool) (files []candidate, ignored []string, errs Errors, err error) {
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("load %s: %w", dir, err)
	}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		show := filepath.Join(dir, strings.TrimPrefix(path, root)) // as the user named the directory
		if err != nil {
			if path == root {
				return err
			}
			errs = append(errs, &ConfigError{File: show, Msg: err.Error()})
			return nil
		}
		if path == root {
			return nil
		}
		if ignoreDot && strings.HasPrefix(d.Name(), ".") {
			ignored = append(ignored, fmt.Sprintf("ignoring %s: hidden entry (RUNTIME_IGNOREDOTFILES=true)", show))
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		fi, err := os.Stat(path) // follows symbolic links
		if err != nil {
			errs = append(errs, &ConfigError{File: show, Msg: err.Error()})
			return nil
		}
		if fi.IsDir() {
			ignored = append(ignored, fmt.Sprintf("ignoring %s: a symbolic link to a directory, which upstream does not read either", show))
			return nil
		}
		files = append(files, candidate{show, fi})
		return nil
	})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("load %s: %w", dir, err)
	}
	return files, ignored, errs, nil
}

// Fingerprint identifies the set of files Load would read in dir with the
// first of opts by their names, sizes and modification times, without
// reading them: a cheap way to tell whether a set already loaded (or rejected) may have changed.
// newest is the latest modification time among them: a file changed again
// within the file system's timestamp granularity keeps its fingerprint, so
// callers should not trust a fingerprint whose newest file is very recent.
func Fingerprint(dir string, opts ...LoadOptions) (fp string, newest time.Time, err error) {
	files, _, errs, err := scan(dir, first(opts))
	if err != nil {
		return "", time.Time{}, err
	}
	h := sha256.New()
	for _, c := range files {
		mt := c.fi.ModTime()
		fmt.Fprintf(h, "%s\x00%d\x00%d\x00", c.path, c.fi.Size(), mt.UnixNano())
		if mt.After(newest) {
			newest = mt
		}
	}
	for _, e := range errs {
		fmt.Fprintf(h, "err\x00%s\x00", e.Error())
	}
	return hex.EncodeToString(h.Sum(nil)), newest, nil
}

// Load reads, with the first of o (without one, the defaults), every
// *.yaml and *.yml file of dir (not recursively; symbolic links are
// followed, so a Kubernetes ConfigMap mount works) and parses them with
// Parse. Entries whose names start with '.' (such as a
// ConfigMap's "..data" and "..2024_01_01..." entries), directories and files
// with other extensions are skipped, each with a line in ignored. A file
// larger than opts.MaxFileBytes is an error and is neither read nor parsed.
// Errors names each file by its path in dir. The error is an Errors when
// validation fails, and a wrapped I/O error when dir cannot be read. An
// empty directory gives a Config without domains.
func Load(dir string, o ...LoadOptions) (cfg *Config, ignored []string, err error) {
	opts := first(o)
	if opts.MaxFileBytes <= 0 {
		opts.MaxFileBytes = DefaultMaxFileBytes
	}
	if opts.MaxFileBytesName == "" {
		opts.MaxFileBytesName = "the size limit"
	}
	list, ignored, errs, err := scan(dir, opts)
	if err != nil {
		return nil, nil, err
	}
	tooBig := func(path string, size int64) *ConfigError {
		return &ConfigError{File: path, Msg: fmt.Sprintf("file is %d bytes, more than the %d bytes of %s; not read",
			size, opts.MaxFileBytes, opts.MaxFileBytesName)}
	}
	files := make(map[string][]byte)
	for _, c := range list {
		if c.fi.Size() > opts.MaxFileBytes {
			errs = append(errs, tooBig(c.path, c.fi.Size()))
			continue
		}
		data, err := readFile(c.path, opts.MaxFileBytes)
		if err != nil {
			errs = append(errs, &ConfigError{File: c.path, Msg: err.Error()})
			continue
		}
		if int64(len(data)) > opts.MaxFileBytes { // grew since stat
			errs = append(errs, tooBig(c.path, int64(len(data))))
			continue
		}
		files[c.path] = data
	}
	if len(errs) > 0 {
		// Some file is unusable: report every error of the others too,
		// but do not build what cannot be used.
		if _, perr := Parse(files, opts.parseOptions()); perr != nil {
			var perrs Errors
			if errors.As(perr, &perrs) {
				errs = append(errs, perrs...)
			}
		}
		errs.sort()
		return nil, ignored, errs
	}
	cfg, err = Parse(files, opts.parseOptions())
	if err != nil {
		var perrs Errors
		if errors.As(err, &perrs) {
			perrs.sort()
			return nil, ignored, perrs
		}
		return nil, ignored, err
	}
	return cfg, ignored, nil
}
