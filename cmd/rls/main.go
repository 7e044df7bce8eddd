// Command rls is a global rate-limit decision service for Envoy and Istio:
// it serves envoy.service.ratelimit.v3.RateLimitService over gRPC, decides
// from descriptor YAML, and counts in an embedded memory store or in Redis.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/rls-project/rls/pkg/compat"
	"github.com/rls-project/rls/pkg/descriptors"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := run(ctx, os.Args[1:], compat.AsRatelimit(os.Args[0], os.Getenv), os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) { // help was asked for and printed
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "rls:", err)
		os.Exit(1)
	}
}

// run is the whole program: it dispatches the subcommand and returns when it
// is done (for serve: when ctx is cancelled and shutdown has finished).
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 0 && (args[0] == "serve" || args[0] == "validate" || args[0] == "simulate" || args[0] == "version" || args[0] == "help") {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "version":
		fmt.Fprintln(stdout, "rls", version())
		return nil
	case "validate":
		if len(args) == 1 && isHelp(args[0]) {
			fmt.Fprint(stdout, validateUsage)
			return flag.ErrHelp
		}
		return validate(args, stdout)
	case "simulate":
		return runSimulate(args, stdout)
	case "help":
		args = []string{"--help"}
		stderr = stdout // asked for: not an error
	}
	cfg, err := parseConfig(args, getenv, stderr)
	if err != nil {
		return err
	}
	if cfg.DryRun {
		return dryRun(cfg, stdout, stderr)
	}
	return serve(ctx, cfg, stderr)
}

// isHelp reports whether arg asks for help.
func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help" || arg == "help"
}

const validateUsage = `usage: rls validate [--merge-domains] DIR

Loads every descriptor YAML file in DIR as rls serve would and prints each
error as file:line: message; exits 1 when any file is invalid.
--merge-domains lets several files define one domain, as rls serve
--merge-domains does.
`

// validate loads a config directory and prints every error as
// file:line: message. It fails when any file is invalid.
func validate(args []string, out io.Writer) error {
	opts := descriptors.LoadOptions{MergeDomainsName: "--merge-domains"}
	if len(args) == 2 && (args[0] == "--merge-domains" || args[0] == "-merge-domains") {
		opts.MergeDomains, args = true, args[1:]
	}
	if len(args) != 1 {
		return errors.New("usage: rls validate [--merge-domains] DIR (rls validate --help)")
	}
	return descriptors.Report(args[0], opts, out)
}

// version reports the module version and VCS revision baked in by go build.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	v := bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			v += " " + s.Value
		}
		if s.Key == "vcs.modified" && s.Value == "true" {
			v += " (modified)"
		}
	}
	return v + " " + bi.GoVersion
}
