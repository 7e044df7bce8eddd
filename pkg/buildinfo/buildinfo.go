// Package buildinfo says which rls this is: the version, commit and build
// date a release sets with -ldflags, else what go build recorded.
package buildinfo

import (
	"fmt"
	"runtime/debug"
)

// Set by the release build (make release, the Dockerfile) with -ldflags
// "-X github.com/rls-project/rls/pkg/buildinfo.Version=v1.2.3 -X ...Commit=...
// -X ...Date=...". Empty in a plain go build: then String reads the build
// info.
var Version, Commit, Date string

// String returns "VERSION commit COMMIT built DATE GOVERSION": the
// release's ldflags, else what go build recorded (the module version,
// vcs.revision, vcs.time, and -modified after the commit when vcs.modified),
// else "(devel)" and "unknown".
func String() string {
	return format(Version, Commit, Date, debug.ReadBuildInfo)
}

func format(v, commit, date string, read func() (*debug.BuildInfo, bool)) string {
	goVersion, modified, vcsCommit := "unknown", false, commit == ""
	if bi, ok := read(); ok {
		goVersion = bi.GoVersion
		if v == "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision" && commit == "":
				commit = s.Value
			case s.Key == "vcs.time" && date == "":
				date = s.Value
			case s.Key == "vcs.modified" && vcsCommit:
				modified = s.Value == "true"
			}
		}
	}
	v, commit, date = orElse(v, "(devel)"), orElse(commit, "unknown"), orElse(date, "unknown")
	if modified {
		commit += "-modified"
	}
	return fmt.Sprintf("%s commit %s built %s %s", v, commit, date, goVersion)
}

func orElse(s, dflt string) string {
	if s == "" {
		return dflt
	}
	return s
}
