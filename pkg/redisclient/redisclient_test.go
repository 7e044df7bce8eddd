package redisclient

import (
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
		want string // substring of the error; "" means valid
	}{
		{"single", Options{URL: "redis://localhost:6379/0"}, ""},
		{"tls", Options{URL: "rediss://u:p@localhost:6380"}, ""},
		{"tls config", Options{URL: "redis://localhost:6380", TLSConfig: &tls.Config{MinVersion: tls.VersionTLS13}}, ""},
		{"cluster", Options{URL: "redis://h1:1?addr=h2:2&addr=h3:3", Mode: "cluster"}, ""},
		{"sentinel", Options{URL: "redis://s1:26379?addr=s2:26379", Mode: "sentinel", MasterName: "mymaster"}, ""},
		{"sentinel url master", Options{URL: "redis://s1:26379?master_name=m", Mode: "sentinel"}, ""},
		{"bad mode", Options{URL: "redis://h:1", Mode: "x"}, `redis option Mode: "x" is invalid; choices are [single cluster sentinel]`},
		{"no url", Options{}, "redis option URL: a URL is required"},
		{"bad scheme", Options{URL: "http://h:1"}, "scheme must be redis, rediss or unix"},
		{"no host", Options{URL: "redis://"}, "no host"},
		{"bad query", Options{URL: "redis://:hunter2@h:1?bogus=1"}, "unexpected option"},
		{"sentinel without master", Options{URL: "redis://s:1", Mode: "sentinel"}, "redis option MasterName: the Sentinel master name is required"},
		{"master outside sentinel", Options{URL: "redis://s:1", MasterName: "m"}, "only valid in sentinel mode"},
		{"negative pool", Options{URL: "redis://h:1", PoolSize: -1}, "redis option PoolSize"},
		{"negative timeout", Options{URL: "redis://h:1", Timeout: -time.Second}, "redis option Timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := New(tc.opts) // must not connect
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate = %v, want an error containing %q", err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error shows the password: %v", err)
			}
			if c != nil {
				c.Close()
			}
		})
	}
}

// TestNewDefaults: socket timeouts of twice the store's timeout, context
// deadlines honoured, one dial attempt, unless the URL says otherwise.
func TestNewDefaults(t *testing.T) {
	p, err := Options{URL: "redis://localhost:1", Mode: ModeSingle, Timeout: time.Second}.clientOptions()
	if err != nil || p.single.ReadTimeout != 2*time.Second || p.single.DialTimeout != 2*time.Second || !p.single.ContextTimeoutEnabled || p.single.DialerRetries != 1 {
		t.Errorf("client options %+v, %v; want socket timeouts of twice the store timeout, context deadlines honoured, one dial attempt", p.single, err)
	}
	p, err = Options{URL: "redis://localhost:1?dialer_retries=3", Mode: ModeCluster}.clientOptions()
	if err != nil || p.cluster.DialerRetries != 3 {
		t.Errorf("cluster client options %+v, %v; want the URL's dialer_retries", p.cluster, err)
	}
	if c, err := New(Options{URL: "redis://localhost:1?addr=localhost:2", Mode: ModeCluster}); err != nil {
		t.Fatal(err)
	} else if cc, ok := c.(*redis.ClusterClient); !ok || cc.Options().MaxRedirects != clusterRedirects {
		t.Errorf("cluster client %T; want one that follows %d redirects", c, clusterRedirects)
	}
}

func TestTLSConfig(t *testing.T) {
	base := &tls.Config{MinVersion: tls.VersionTLS13}
	p, err := Options{URL: "redis://cache.internal:6380", Mode: ModeSingle, TLSConfig: base}.clientOptions()
	if err != nil {
		t.Fatal(err)
	}
	got := p.single.TLSConfig
	if got == nil || got == base || got.ServerName != "cache.internal" || got.MinVersion != tls.VersionTLS13 {
		t.Errorf("TLSConfig = %+v; want a clone of the option with ServerName cache.internal", got)
	}
	if base.ServerName != "" {
		t.Error("the caller's TLSConfig was modified")
	}
	p, err = Options{URL: "rediss://cache.internal:6380", Mode: ModeCluster}.clientOptions()
	if err != nil || p.cluster.TLSConfig == nil {
		t.Errorf("rediss:// in cluster mode: TLS %v, %v", p.cluster.TLSConfig, err)
	}
	if !p.cluster.ContextTimeoutEnabled {
		t.Error("ContextTimeoutEnabled is off: Decide's deadline would not bound socket I/O")
	}
}

func TestPasswordNeverShown(t *testing.T) {
	for _, raw := range []string{
		"redis://user:hunter2@h:1?bogus=1",
		"redis://h:1?password=hunter2&bogus=1",
		"redis://user:hunter2@h:1/notadb",
		"redis://user:hunter2@h:1/%zz",
		"redis://user:hunter2@[::1:1",
		"ftp://user:hunter2@h:1",
	} {
		for _, mode := range modes {
			_, err := New(Options{URL: raw, Mode: mode, MasterName: "m"})
			if err == nil {
				t.Errorf("%s %s: no error", mode, raw)
				continue
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("%s: error shows the password: %v", mode, err)
			}
		}
	}
}

// TestUnparsableURLRedacted: a URL option that is not a URL is shown in
// the error, with its passwords hidden, and says why it is not one.
func TestUnparsableURLRedacted(t *testing.T) {
	_, err := New(Options{URL: "redis://u:secret@host:port:bad"})
	want := `redis option URL: "redis://u:xxxxx@host:port:bad" is invalid: it is not a URL (invalid port ":bad" after host)`
	if err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
	for raw, want := range map[string]string{
		"redis://:p@ss@h:1:2/0?password=secret2":    "redis://:xxxxx@h:1:2/0?password=xxxxx",
		"redis://h:1:2?sentinel_password=secret3&x": "redis://h:1:2?sentinel_password=xxxxx&x",
		"redis://user@h:1%zz":                       "redis://user@h:1%zz",
		"not a url at all":                          "not a url at all",
	} {
		if got := redactText(raw); got != want {
			t.Errorf("redactText(%q) = %q, want %q", raw, got, want)
		}
	}
}
