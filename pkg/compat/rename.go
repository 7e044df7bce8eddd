package compat

import (
	"slices"
	"strings"
)

// flagOf is the flag of an RLS_* variable: RLS_CONFIG_DIR → config-dir.
func flagOf(v string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(v, "RLS_")), "_", "-")
}

// Renames maps each RLS_* variable of env (Settings.Env) whose value came
// from upstream's variables to those variables (Sources), unless getenv
// sets the RLS_* variable itself or its flag was given on the command line
// (given). It returns nil when there is none.
func Renames(env map[string]string, getenv func(string) string, given func(flag string) bool) map[string]string {
	var names map[string]string
	for k := range env {
		if up, ok := Sources[k]; ok && getenv(k) == "" && !given(flagOf(k)) {
			if names == nil {
				names = map[string]string{}
			}
			names[k] = up
		}
	}
	return names
}

// Rename rewrites err to name the upstream variables a setting came from
// where it names the RLS_* variable rls read them as (names, from
// Renames): "RUNTIME_ROOT, RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY
// (--config-dir)" for "--config-dir (RLS_CONFIG_DIR)", REDIS_AUTH for
// RLS_REDIS_PASSWORD. The result unwraps to err; a nil err, or one naming
// none of them, is returned as it is.
func Rename(err error, names map[string]string) error {
	if err == nil || len(names) == 0 {
		return err
	}
	vars := make([]string, 0, len(names))
	for k := range names {
		vars = append(vars, k)
	}
	slices.SortFunc(vars, func(a, b string) int { return len(b) - len(a) }) // RLS_X_Y before RLS_X
	msg := err.Error()
	for _, v := range vars {
		flagName := "--" + flagOf(v)
		msg = strings.ReplaceAll(msg, flagName+" ("+v+")", names[v]+" ("+flagName+")")
		msg = strings.ReplaceAll(msg, v, names[v])
	}
	if msg == err.Error() {
		return err
	}
	return &renamedError{msg: msg, err: err}
}

// renamedError is an error with upstream's variable names in its message.
type renamedError struct {
	msg string
	err error
}

func (e *renamedError) Error() string { return e.msg }
func (e *renamedError) Unwrap() error { return e.err }
