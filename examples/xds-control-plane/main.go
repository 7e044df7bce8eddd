// Command xds-control-plane is a minimal xDS management server for rls:
// it serves the RateLimitConfig resources of a YAML file from a
// go-control-plane snapshot cache, the way Envoy Gateway configures its
// rate limit service, and publishes a new snapshot version whenever the
// file changes. It logs every ACK and NACK it receives.
//
//	go run ./examples/xds-control-plane --config resources.yaml --addr 127.0.0.1:18000 --node-id rls
//	rls --config-source xds --xds-server 127.0.0.1:18000 --xds-node-id rls
//
// The file is a list of RateLimitConfig messages, fields named as in the
// protobuf (ratelimit.config.ratelimit.v3), units in capitals:
//
//   - name: api
//     domain: api
//     descriptors:
//   - key: api_key
//     rate_limit: {unit: MINUTE, requests_per_unit: 100}
//
// With --tls-cert, --tls-key and --tls-client-ca it requires mutual TLS
// 1.3, as Envoy Gateway's rate limit xDS server does.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/encoding/protojson"
	"gopkg.in/yaml.v3"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:18000", "listen address")
	nodeID := flag.String("node-id", "rls", "node id of the rls replicas (their --xds-node-id)")
	config := flag.String("config", "resources.yaml", "YAML list of RateLimitConfig resources")
	poll := flag.Duration("poll", time.Second, "how often to look for changes of --config")
	cert := flag.String("tls-cert", "", "PEM server certificate; with --tls-key and --tls-client-ca: mutual TLS")
	key := flag.String("tls-key", "", "PEM key of --tls-cert")
	clientCA := flag.String("tls-client-ca", "", "PEM CA that rls's client certificates must chain to")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, *addr, *nodeID, *config, *poll, *cert, *key, *clientCA); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, addr, nodeID, config string, poll time.Duration, cert, key, clientCA string) error {
	// rls pings its control plane every 10 s (HTTP/2 keepalive) to notice a
	// server that hangs; grpc-go's default policy would answer pings more
	// often than every 5 minutes with GOAWAY "too_many_pings".
	opts := []grpc.ServerOption{grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true})}
	if cert != "" {
		tc, err := mutualTLS(cert, key, clientCA)
		if err != nil {
			return err
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}

	// The control plane: a snapshot cache keyed by node id, served over
	// ADS state of the world (what Envoy Gateway runs for its rate limit
	// service), with callbacks that see every ACK and NACK.
	cache := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	callbacks := serverv3.CallbackFuncs{
		StreamRequestFunc: func(_ int64, req *discoveryv3.DiscoveryRequest) error {
			switch {
			case req.GetErrorDetail() != nil:
				log.Printf("NACK from %s: version %q kept, response %s rejected: %s",
					req.GetNode().GetId(), req.GetVersionInfo(), req.GetResponseNonce(), req.GetErrorDetail().GetMessage())
			case req.GetResponseNonce() != "":
				log.Printf("ACK from %s: version %q", req.GetNode().GetId(), req.GetVersionInfo())
			}
			return nil
		},
	}
	srv := grpc.NewServer(opts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(srv, serverv3.NewServer(ctx, cache, callbacks))

	// Each change of the file is a new snapshot for the node, all its
	// resources at once, under the next version number.
	version := 0
	publish := func(res []types.Resource) error {
		version++
		snap, err := cachev3.NewSnapshot(strconv.Itoa(version), map[resourcev3.Type][]types.Resource{resourcev3.RateLimitConfigType: res})
		if err != nil {
			return err
		}
		return cache.SetSnapshot(ctx, nodeID, snap)
	}

	go watch(ctx, config, poll, publish)
	go func() { <-ctx.Done(); srv.Stop() }()
	log.Printf("serving RateLimitConfig to node %q on %s (TLS: %v)", nodeID, lis.Addr(), cert != "")
	return srv.Serve(lis)
}

// watch publishes the file's resources, then again whenever its size or
// modification time changes. A file that does not load is logged and not
// published.
func watch(ctx context.Context, file string, poll time.Duration, publish func([]types.Resource) error) {
	var seen string
	for {
		if st, err := os.Stat(file); err != nil {
			log.Printf("config: %v", err)
		} else if stamp := fmt.Sprint(st.Size(), st.ModTime().UnixNano()); stamp != seen {
			seen = stamp
			res, err := load(file)
			if err == nil {
				err = publish(res)
			}
			if err != nil {
				log.Printf("config %s not published: %v", file, err)
			} else {
				log.Printf("published %d resources from %s", len(res), file)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(poll):
		}
	}
}

// load reads a YAML list of RateLimitConfig messages.
func load(file string) ([]types.Resource, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var items []any
	if err := yaml.Unmarshal(data, &items); err != nil {
		return nil, err
	}
	res := make([]types.Resource, 0, len(items))
	for i, item := range items {
		js, err := json.Marshal(item)
		if err != nil {
			return nil, fmt.Errorf("resource %d: %w", i, err)
		}
		c := &rlsconf.RateLimitConfig{}
		if err := protojson.Unmarshal(js, c); err != nil {
			return nil, fmt.Errorf("resource %d: %w", i, err)
		}
		res = append(res, c)
	}
	return res, nil
}

// mutualTLS requires TLS 1.3 and a client certificate signed by clientCA.
func mutualTLS(cert, key, clientCA string) (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, err
	}
	pem, err := os.ReadFile(clientCA)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New(clientCA + ": no certificate")
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, ClientAuth: tls.RequireAndVerifyClientCert,
		ClientCAs: pool, MinVersion: tls.VersionTLS13}, nil
}
