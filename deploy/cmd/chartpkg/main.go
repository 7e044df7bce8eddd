// Command chartpkg packages the Helm chart as `helm package --version V
// --app-version A` does, with Helm's own packages (no helm binary needed):
//
//	go run ./cmd/chartpkg -chart helm/rls -version 0.1.0 -app-version v0.1.0 -out ../dist
//
// It prints the path of the .tgz it wrote. make release runs it.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "chartpkg:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("chartpkg", flag.ContinueOnError)
	dir := fs.String("chart", "helm/rls", "chart directory")
	version := fs.String("version", "", "the chart's version (SemVer, no leading v)")
	appVersion := fs.String("app-version", "", "the chart's appVersion: the release's version, the image tag by default")
	out := fs.String("out", ".", "directory to write the package into")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *version == "" || *appVersion == "" {
		return errors.New("-version and -app-version are required")
	}
	// The chart as released must pass lint as the tests' chart does.
	for _, m := range lint.All(*dir, nil, "rls", true).Messages {
		if m.Severity >= support.WarningSev {
			return fmt.Errorf("helm lint: %s", m)
		}
	}
	ch, err := loader.Load(*dir)
	if err != nil {
		return fmt.Errorf("load %s: %w", *dir, err)
	}
	ch.Metadata.Version, ch.Metadata.AppVersion = *version, *appVersion
	if err := ch.Validate(); err != nil {
		return fmt.Errorf("chart %s %s: %w", ch.Name(), *version, err)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	path, err := chartutil.Save(ch, *out)
	if err != nil {
		return fmt.Errorf("package: %w", err)
	}
	fmt.Println(path)
	return nil
}
