package integration

import (
	"crypto/tls"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/integration/redistest"
)

// TestDropinClientSAN: with --grpc-tls-client-san, only the client CA's
// certificates that name the SAN may call; as ratelimit,
// GRPC_CLIENT_TLS_SAN does the same.
func TestDropinClientSAN(t *testing.T) {
	light(t)
	f := tlNewFiles(t)
	named := f.clientConfig(t, f.clientCA.ClientSAN(t, "envoy", "envoy.mesh.local"))
	other := f.clientConfig(t, f.clientCA.ClientSAN(t, "other", "other.mesh.local"))
	check := func(t *testing.T, p *rlsProc) {
		if r := should(t, p.client(), "rl", desc("foo", "san")); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("the client naming the SAN: %v, want OK", r.OverallCode)
		}
		for name, c := range map[string]*tls.Config{"another SAN": other, "the CA's certificate without a SAN": f.clientConfig(t, f.client)} {
			if err := tlShould(tlDial(t, p.GRPCAddr, c)); status.Code(err) != codes.Unavailable {
				t.Errorf("%s: %v, want Unavailable (refused in the handshake)", name, err)
			}
		}
	}
	t.Run("flag", func(t *testing.T) {
		dir := writeConfig(t, map[string]string{"rl.yaml": "domain: rl\ndescriptors:\n  - key: foo\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"})
		check(t, tlStartRLS(t, dir, named, "--grpc-tls-cert", f.certFile, "--grpc-tls-key", f.keyFile,
			"--grpc-tls-client-ca", f.clientCAFile, "--grpc-tls-client-san", "envoy.mesh.local"))
	})
	t.Run("as ratelimit", func(t *testing.T) {
		env := upstreamExampleEnv(redistest.StartServer(t).Addr)
		for k, v := range map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": f.certFile, "GRPC_SERVER_TLS_KEY": f.keyFile,
			"GRPC_CLIENT_TLS_CACERT": f.clientCAFile, "GRPC_CLIENT_TLS_SAN": "envoy.mesh.local"} {
			env[k] = v
		}
		check(t, startAsRatelimitConn(t, env, func(addr string) *grpc.ClientConn { return tlDial(t, addr, named) }))
	})
}
