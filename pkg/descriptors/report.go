package descriptors

import (
	"errors"
	"fmt"
	"io"
	"sort"
)

// Report loads dir as LoadWith does and prints to out what rls validate
// prints: the notes, then each error as file:line: message, or a line
// naming the domains. It fails when any file is invalid.
func Report(dir string, opts LoadOptions, out io.Writer) error {
	cfg, notes, err := LoadWith(dir, opts)
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
	fmt.Fprintf(out, "%s: ok, %d domain(s) %v\n", dir, len(domains), domains)
	return nil
}
