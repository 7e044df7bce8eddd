package buildinfo

import (
	"runtime/debug"
	"testing"
)

func TestFormat(t *testing.T) {
	vcs := func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.time", Value: "2026-12-01T10:00:00Z"}, {Key: "vcs.modified", Value: "true"}}}, true
	}
	none := func() (*debug.BuildInfo, bool) { return nil, false }
	for _, c := range []struct {
		v, commit, date string
		read            func() (*debug.BuildInfo, bool)
		want            string
	}{
		{"v1.2.3", "0123abc", "2026-12-02T15:00:00Z", vcs, "v1.2.3 commit 0123abc built 2026-12-02T15:00:00Z go1.26.8"},
		{"", "", "", vcs, "(devel) commit abc123-modified built 2026-12-01T10:00:00Z go1.26.8"},
		{"", "", "", none, "(devel) commit unknown built unknown unknown"},
	} {
		if got := format(c.v, c.commit, c.date, c.read); got != c.want {
			t.Errorf("format(%q, %q, %q) = %q, want %q", c.v, c.commit, c.date, got, c.want)
		}
	}
}
