package tlsconfig

import (
	"log/slog"
	"testing"

	"github.com/rls-project/rls/pkg/tlsconfig/tlstest"
)

// TestClientSAN: with ClientSAN, only the client CA's certificates that name
// it complete the handshake.
func TestClientSAN(t *testing.T) {
	e := newEnv(t)
	r, err := NewReloader(Files{Cert: e.certFile, Key: e.keyFile, ClientCA: e.caF, ClientSAN: "envoy.mesh.local"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	named := pair(t, e.clientCA.ClientSAN(t, "envoy", "envoy.mesh.local"))
	if _, err := handshake(t, r.ServerConfig(), e.clientConfig(named)); err != nil {
		t.Fatalf("the client naming the SAN: %v", err)
	}
	wildcard := pair(t, e.clientCA.ClientSAN(t, "envoy-2", "*.mesh.local"))
	if _, err := handshake(t, r.ServerConfig(), e.clientConfig(wildcard)); err != nil {
		t.Fatalf("the client naming *.mesh.local: %v", err)
	}
	for name, p := range map[string]tlstest.Pair{
		"another SAN":  e.clientCA.ClientSAN(t, "other", "other.mesh.local"),
		"no SAN":       e.clientCA.Client(t, "envoy.mesh.local"), // the CN does not count
		"another CA's": e.ca.ClientSAN(t, "envoy", "envoy.mesh.local"),
	} {
		if _, err := handshake(t, r.ServerConfig(), e.clientConfig(pair(t, p))); err == nil {
			t.Errorf("a client certificate with %s was accepted", name)
		}
	}
}
