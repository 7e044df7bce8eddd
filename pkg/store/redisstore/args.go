package redisstore

import "github.com/rls-project/rls/pkg/store/redisstore/lua"

// Boxed once: the header arguments of every call. A request's checks are
// one binary argument (lua.AppendCheck), so no number is formatted per
// call.
var (
	argNoClock    any = ""
	argModeDecide any = lua.ModeDecide
	argModePeek   any = lua.ModePeek
)
