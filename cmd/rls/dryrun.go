package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/rls-project/rls/pkg/redisclient"
)

// dryRun is `rls serve --dry-run`, after parseConfig has checked the flags
// and environment as for serving. It loads --config-dir as serve would if
// the directory exists here; a missing one (often a volume of the pod only)
// is reported, not checked. Nothing listens and no store is opened.
func dryRun(cfg *Config, stdout, stderr io.Writer) error {
	store := cfg.storeKind()
	if store == "redis" {
		store = fmt.Sprintf("redis (%s, %s)", cfg.redisMode(), redisclient.RedactURL(cfg.RedisURL))
	}
	if g := &cfg.Global; g.on() {
		store += fmt.Sprintf(", region %s, global store (%s, %s)", g.Region, g.Mode, redisclient.RedactURL(g.ClientURL))
	}
	if _, err := os.Stat(cfg.ConfigDir); errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(stdout, "rls serve --dry-run: flags ok, store %s; --config-dir %s does not exist here: not checked\n", store, cfg.ConfigDir)
		return nil
	}
	rules, err := loadRules(cfg, func(n string) { newLogger(cfg, stderr).Info(n) })
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "rls serve --dry-run: flags ok, store %s; config ok, %d domain(s) %v\n", store, len(rules.Domains()), rules.Domains())
	return nil
}
