package descriptors

import (
	"errors"
	"fmt"
	"io"
	"sort"
)

// LoadDir is Load, refusing a directory without any domain (it would
// limit nothing) unless opts.AllowEmpty: what rls serve, --dry-run and rls
// validate load alike.
func LoadDir(dir string, opts LoadOptions) (*Config, []string, error) {
	cfg, notes, err := Load(dir, opts)
	if err == nil && len(cfg.Domains()) == 0 && !opts.AllowEmpty {
		return nil, notes, fmt.Errorf("%s has no domain (no .yaml or .yml file with a domain), so rls would limit nothing; "+
			"add the config, or pass %s to start without one", dir, opts.AllowEmptyName)
	}
	return cfg, notes, err
}

// Report loads dir as LoadDir does and prints to out what rls validate
// prints: the notes, then each error as file:line: message, or the rules
// no RLQS BucketId reaches (BucketUnreachable) and a line naming the
// domains. It fails when any file is invalid.
func Report(dir string, opts LoadOptions, out io.Writer) error {
	cfg, notes, err := LoadDir(dir, opts)
	for _, n := range notes {
		fmt.Fprintln(out, n)
	}
	if err != nil {
		var list Errors
		if errors.As(err, &list) {
			for _, e := range list {
				fmt.Fprintln(out, e.Error())
			}
			return fmt.Errorf("%s: %d error(s)", dir, len(list))
		}
		return err
	}
	domains := cfg.Domains()
	sort.Strings(domains)
	for _, d := range domains {
		for _, m := range cfg.BucketUnreachable(d) {
			fmt.Fprintln(out, m) // a note: ShouldRateLimit still reaches the rule
		}
	}
	fmt.Fprintf(out, "%s: ok, %d domain(s) %v\n", dir, len(domains), domains)
	return nil
}
