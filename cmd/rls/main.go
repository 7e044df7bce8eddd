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
	"slices"
	"syscall"

	"github.com/rls-project/rls/internal/simulatecmd"
	"github.com/rls-project/rls/pkg/buildinfo"
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
	cmd, args := subcommand(args)
	switch cmd {
	case "version":
		fmt.Fprintln(stdout, "rls", buildinfo.String())
		return nil
	case "validate":
		if len(args) == 1 && isHelp(args[0]) {
			fmt.Fprint(stdout, validateUsage)
			return flag.ErrHelp
		}
		return validate(args, getenv, stdout)
	case "simulate":
		return simulatecmd.Run(ctx, args, stdout)
	case "help":
		args = []string{"--help"}
		stderr = stdout // asked for: not an error
	}
	cfg, err := parseConfig(args, getenv, stderr)
	if err != nil {
		return cfg.upstreamError(err)
	}
	if cfg.DryRun {
		return cfg.upstreamError(dryRun(cfg, stdout, stderr))
	}
	return cfg.upstreamError(serve(ctx, cfg, stderr))
}

// subcommand splits args into the subcommand (serve when none is named)
// and its arguments; a lone --version after it is version.
func subcommand(args []string) (string, []string) {
	cmd := "serve"
	if len(args) > 0 && slices.Contains([]string{"serve", "validate", "simulate", "version", "help"}, args[0]) {
		cmd, args = args[0], args[1:]
	}
	if len(args) == 1 && (args[0] == "--version" || args[0] == "-version") { // rls --version, as most servers answer it
		cmd = "version"
	}
	return cmd, args
}

// isHelp reports whether arg asks for help.
func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help" || arg == "help"
}

const validateUsage = `usage: rls validate [--merge-domains] [--allow-empty-config] [--env-compat upstream] [--region R --global-redis-url URL] DIR

Loads every descriptor YAML file in DIR as rls serve would and prints each
error as file:line: message; exits 1 when any file is invalid, or when DIR
has no domain (rls serve refuses to start on it). --merge-domains and
--allow-empty-config mean what they mean to rls serve. With --env-compat
upstream (RLS_ENV_COMPAT=upstream, the default run as ratelimit) it loads
the files upstream loads, subdirectories and every name included
(RUNTIME_IGNOREDOTFILES, MERGE_DOMAIN_CONFIG read), as rls serve does then.
Rules of scope: global are accepted only with --region and
--global-redis-url, as rls serve needs them.
`

// validate loads a config directory as serve would (loadRules) and prints
// every error as file:line: message. In upstream mode (--env-compat, or its
// twin, as ratelimit) it reads upstream's environment as serve does.
func validate(args []string, getenv func(string) string, out io.Writer) error {
	cfg := defaultConfig()
	fs := flag.NewFlagSet("rls validate", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.BoolVar(&cfg.MergeDomains, "merge-domains", false, "")
	fs.BoolVar(&cfg.AllowEmptyConfig, "allow-empty-config", false, "")
	fs.StringVar(&cfg.EnvCompat, "env-compat", "", "")
	fs.StringVar(&cfg.Global.Region, "region", "", "")
	fs.StringVar(&cfg.Global.RedisURL, "global-redis-url", "", "")
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		return errors.New("usage: rls validate [--merge-domains] [--allow-empty-config] [--env-compat upstream] [--region R --global-redis-url URL] DIR (rls validate --help)")
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	upstreamEnv, err := cfg.readCompat(set["env-compat"], getenv)
	if err != nil {
		return err
	}
	if cfg.EnvCompat == "upstream" {
		cfg.MergeDomains = cfg.MergeDomains || upstreamEnv("RLS_MERGE_DOMAINS") == "true"
		cfg.DefaultAlgorithm = upstreamEnv("RLS_DEFAULT_ALGORITHM")
	}
	cfg.ConfigDir = fs.Arg(0)
	return descriptors.Report(cfg.ConfigDir, loadOptions(cfg), out)
}
