package redisclient

import (
	"cmp"
	"net/url"
)

// Node names the Redis node of o outside cluster mode, for metrics: the
// URL's host:port, or its socket's path; a Sentinel's master is "master"
// and the master name (o.MasterName, else the URL's master_name). An
// unparsable URL is "unknown".
func Node(o Options) string {
	u, err := url.Parse(o.URL)
	switch {
	case err != nil:
		return "unknown"
	case o.Mode == ModeSentinel:
		return "master " + cmp.Or(o.MasterName, u.Query().Get("master_name"))
	case u.Scheme == "unix":
		return u.Path
	}
	return u.Host
}
