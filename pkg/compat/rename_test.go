package compat

import (
	"errors"
	"testing"
)

// TestRename: an error names the upstream variables a setting came from,
// the longest RLS_* name first, and still unwraps to the error; names the
// user set themselves (or whose flag was given) are left alone.
func TestRename(t *testing.T) {
	env := map[string]string{"RLS_CONFIG_DIR": "/x", "RLS_REDIS_PASSWORD": "p", "RLS_LOG_LEVEL": "info"}
	names := Renames(env, func(k string) string { return map[string]string{"RLS_LOG_LEVEL": "info"}[k] },
		func(flag string) bool { return flag == "redis-password" })
	if len(names) != 1 || names["RLS_CONFIG_DIR"] != Sources["RLS_CONFIG_DIR"] {
		t.Fatalf("Renames: %v, want RLS_CONFIG_DIR only", names)
	}
	base := errors.New("--config-dir (RLS_CONFIG_DIR): no such directory")
	err := Rename(base, names)
	if want := Sources["RLS_CONFIG_DIR"] + " (--config-dir): no such directory"; err.Error() != want {
		t.Errorf("Rename: %q, want %q", err, want)
	}
	if !errors.Is(err, base) {
		t.Error("the renamed error does not unwrap to the error")
	}
	other := errors.New("--log-level (RLS_LOG_LEVEL) is invalid")
	if Rename(other, names) != other || Rename(nil, names) != nil || Rename(base, nil) != base {
		t.Error("an error naming none of the variables, nil, or no names: not returned as it is")
	}
}
