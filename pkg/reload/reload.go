// Package reload watches a descriptor config directory and applies every
// valid new version of it: fsnotify events (including Kubernetes ConfigMap
// "..data" symlink swaps and editors' atomic renames) are debounced, the whole
// directory is loaded and validated, and only a fully valid set replaces the
// config in force. A poll catches changes whose events were missed.
package reload

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/store"
)

// Result is the outcome of one reload attempt.
type Result string

// The results, as the result label of rls_config_reloads_total.
const (
	Success   Result = "success"
	Failure   Result = "failure"
	Unchanged Result = "unchanged"
)

// Options configure a Watcher. Zero fields take the defaults in brackets.
type Options struct {
	Dir      string
	Debounce time.Duration // quiet time after the last event before loading [250ms]
	Poll     time.Duration // reload check without events [10s]; <0 disables
	// Apply receives every new valid config (called from one goroutine).
	Apply func(*descriptors.Config)
	// Report, if set, is told about every attempt.
	Report func(Result, *descriptors.Config)
	Log    *slog.Logger // [discard]
	// MaxFileBytes is the largest config file read; larger is a failure
	// [descriptors.DefaultMaxFileBytes]. MaxFileBytesName names the limit
	// in that error (the flag that sets it).
	MaxFileBytes     int64
	MaxFileBytesName string
	// AllowEmpty lets a reload apply a config without domains. Without it,
	// a directory that lost every domain is a failure: the last good config
	// stays, rather than every limit vanishing with the files.
	// AllowEmptyName names that option in the failure (the flag that sets
	// it); "" names none.
	AllowEmpty     bool
	AllowEmptyName string
	// MergeDomains lets several files define one domain, and
	// MergeDomainsName names that option in errors
	// (descriptors.ParseOptions).
	MergeDomains     bool
	MergeDomainsName string
	// DefaultAlgorithm is the algorithm of rules that name none
	// (descriptors.ParseOptions).
	DefaultAlgorithm store.Algorithm
	// Global allows rules of scope: global (descriptors.ParseOptions).
	Global bool
	// Upstream and IgnoreDotFiles select the files as envoyproxy/ratelimit
	// does (descriptors.LoadOptions): subdirectories are read (their
	// changes are seen by the poll).
	Upstream, IgnoreDotFiles bool
	// Check, when set, refuses a valid config the server cannot serve
	// (rules its store cannot count): its error fails the reload as a
	// broken file does.
	Check func(*descriptors.Config) error
}

// load is descriptors.Load; tests count its calls.
var load = func(dir string, o descriptors.LoadOptions) (*descriptors.Config, []string, error) {
	return descriptors.Load(dir, o)
}

// racyWindow is how old the newest file of a rejected set must be before
// its fingerprint is trusted to skip it: a file rewritten again within the
// file system's timestamp granularity keeps its size and mtime.
var racyWindow = 2 * time.Second

// Watcher reloads a config directory. Use New, then Run.
type Watcher struct {
	opts    Options
	mu      sync.Mutex
	hash    string // of the config in force
	lastBad string // the errors last logged, so a broken file is logged once
	// failed is the fingerprint (names, sizes, mtimes) of the file set last
	// rejected: while the directory still has it, Reload fails without
	// reading or parsing the files again. Empty when none is trusted.
	failed string
}

// New returns a Watcher whose config in force is current.
func New(current *descriptors.Config, opts Options) *Watcher {
	if opts.Debounce <= 0 {
		opts.Debounce = 250 * time.Millisecond
	}
	if opts.Poll == 0 {
		opts.Poll = 10 * time.Second
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return &Watcher{opts: opts, hash: current.Hash()}
}

// Run watches until ctx ends. It returns an error only if the directory
// cannot be watched at all.
func (w *Watcher) Run(ctx context.Context) error {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer fw.Close()
	if err := fw.Add(w.opts.Dir); err != nil {
		return err
	}
	var poll <-chan time.Time
	if w.opts.Poll > 0 {
		t := time.NewTicker(w.opts.Poll)
		defer t.Stop()
		poll = t.C
	}
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-fw.Events:
			if !ok {
				return nil
			}
			if relevant(ev) {
				debounce.Reset(w.opts.Debounce)
			}
		case err, ok := <-fw.Errors:
			if !ok {
				return nil
			}
			w.opts.Log.Warn("config watch error; the poll still picks up changes", "dir", w.opts.Dir, "err", err)
		case <-debounce.C:
			w.Reload()
		case <-poll:
			w.Reload()
		}
	}
}

// relevant ignores events that cannot change the config: chmod-only
// events and editors' swap files.
func relevant(ev fsnotify.Event) bool {
	if ev.Op == fsnotify.Chmod {
		return false
	}
	name := ev.Name
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	return !strings.HasSuffix(name, "~") && !strings.HasSuffix(name, ".swp")
}

// Reload loads the directory now and applies it if it is valid and differs
// from the config in force. A broken directory keeps the config in force;
// its errors are logged once (as file:line: message) until they change. A
// set of files already rejected is not read again until one of them changes
// (name, size or modification time): it fails at the cost of a stat per file.
// Without AllowEmpty, a directory without any domain is rejected too.
func (w *Watcher) Reload() Result {
	w.mu.Lock()
	defer w.mu.Unlock()
	lo := descriptors.LoadOptions{MaxFileBytes: w.opts.MaxFileBytes, MaxFileBytesName: w.opts.MaxFileBytesName,
		MergeDomains: w.opts.MergeDomains, MergeDomainsName: w.opts.MergeDomainsName, DefaultAlgorithm: w.opts.DefaultAlgorithm,
		Upstream: w.opts.Upstream, IgnoreDotFiles: w.opts.IgnoreDotFiles, Global: w.opts.Global}
	fp, newest, fpErr := descriptors.Fingerprint(w.opts.Dir, lo)
	if fpErr == nil && fp == w.failed {
		w.report(Failure, nil)
		return Failure
	}
	w.failed = ""
	cfg, _, err := load(w.opts.Dir, lo)
	if err == nil && len(cfg.Domains()) == 0 && !w.opts.AllowEmpty {
		err = errors.New("the config directory " + w.opts.Dir + " has no domain left (no .yaml or .yml file with a domain): " +
			"a reload to it would remove every limit" + allowHint(w.opts.AllowEmptyName))
	}
	if err == nil && w.opts.Check != nil {
		err = w.opts.Check(cfg)
	}
	if err != nil {
		msg := err.Error()
		if msg != w.lastBad {
			w.lastBad = msg
			var list descriptors.Errors
			if errors.As(err, &list) {
				for _, e := range list {
					w.opts.Log.Error("config reload rejected; keeping the last good config", "error", e.Error())
				}
			} else {
				w.opts.Log.Error("config reload rejected; keeping the last good config", "error", msg)
			}
		}
		if fpErr == nil && time.Since(newest) >= racyWindow {
			w.failed = fp
		}
		w.report(Failure, nil)
		return Failure
	}
	w.lastBad = ""
	if cfg.Hash() == w.hash {
		w.report(Unchanged, cfg)
		return Unchanged
	}
	w.hash = cfg.Hash()
	w.opts.Apply(cfg)
	w.opts.Log.Info("config reloaded", "domains", cfg.Domains(), "hash", cfg.Hash())
	w.report(Success, cfg)
	return Success
}

func (w *Watcher) report(r Result, cfg *descriptors.Config) {
	if w.opts.Report != nil {
		w.opts.Report(r, cfg)
	}
}

// allowHint is the end of the empty-directory failure: which option allows
// it, when the caller named it.
func allowHint(name string) string {
	if name == "" {
		return ""
	}
	return " (" + name + " allows it)"
}
