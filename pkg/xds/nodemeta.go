package xds

import (
	"fmt"
	"strings"
)

// ParseNodeMetadata reads the node metadata rls sends: key=value pairs
// separated by commas, as envoyproxy/ratelimit's CONFIG_GRPC_XDS_NODE_METADATA.
func ParseNodeMetadata(s string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	m := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not key=value (want key=value pairs separated by commas)", kv)
		}
		if _, dup := m[k]; dup {
			return nil, fmt.Errorf("key %q given twice", k)
		}
		m[k] = strings.TrimSpace(v)
	}
	return m, nil
}
