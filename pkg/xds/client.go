package xds

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/logthrottle"
)

// Options configure a Client. Zero fields take the defaults in brackets.
type Options struct {
	// Server is the management server's address, host:port.
	Server string
	// NodeID and NodeMetadata identify rls to the server (a snapshot
	// cache keys its snapshots by node id).
	NodeID       string
	NodeMetadata map[string]string
	// Version is rls's version, sent as the node's user agent version.
	Version string
	// TLS secures the connection; nil is plaintext.
	TLS *tls.Config
	// MaxRecvBytes bounds one response [4 MiB, gRPC's default].
	MaxRecvBytes int
	// Limits bound each response before it is decoded (see Limits).
	Limits Limits
	// KeepaliveTime and KeepaliveTimeout are the HTTP/2 keepalive of the
	// channel [10s, 10s; gRPC's floor is 10s]: after KeepaliveTime without a frame from the
	// server, rls pings it, and closes the connection when no answer
	// comes within KeepaliveTimeout. The stream then fails and is opened
	// again, so a server that hangs (a stopped process, a dead peer
	// behind a NAT or a proxy that keeps the TCP connection) is noticed
	// within their sum. The server must permit a ping that often
	// (grpc-go's keepalive.EnforcementPolicy.MinTime; its default of
	// 5 minutes answers "too_many_pings", closing the connection, and
	// gRPC then doubles the interval for the connection).
	KeepaliveTime, KeepaliveTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait between two attempts to
	// open the stream [500ms, 30s]. It doubles from MinBackoff after each
	// attempt that got no response, jittered down by up to half.
	MinBackoff, MaxBackoff time.Duration
	// Update is given each response's resources, decoded, and its
	// version_info. nil ACKs the response; an error NACKs it, with the
	// error as the error_detail (the config in force stays, and the next
	// ACK or NACK names the version last ACKed). Called from Run's
	// goroutine, one response at a time.
	Update func(version string, resources []*rlsconf.RateLimitConfig) error
	// Rejected, if set, is told of each response NACKed before Update saw
	// it: resources of another type, bytes that do not decode, a response
	// over the Limits. Called as Update is.
	Rejected func(version string, err error)
	// Connected, if set, is told when a stream opens (true) and ends.
	Connected func(bool)
	Log       *slog.Logger // [discard]
}

// Client keeps a state-of-the-world ADS stream to the management server
// for RateLimitConfig resources. Use New, then Run.
type Client struct {
	opts Options
	node *corev3.Node

	mu       sync.Mutex
	accepted string // version_info of the last response ACKed (any stream)

	nackLog   *logthrottle.Throttle // the NACKs' log line
	pingsOnce sync.Once             // the hint about too_many_pings

	// attempts counts the streams opened or tried, for tests.
	attempts atomic.Int64

	// rejected is the response last NACKed on the current stream, to
	// answer its repetitions (see answer) without applying them again.
	rejected struct {
		key  string // responseKey
		err  error
		wait time.Duration // before the last repeated NACK
	}
}

// A control plane resends a NACKed response at once: go-control-plane's
// snapshot cache answers every request whose version_info (a NACK's is the
// last version ACKed) differs from its snapshot's. Repetitions are NACKed
// again without being applied, after a wait that doubles from
// nackRepeatMin to nackRepeatMax, so a bad snapshot costs a few messages a
// minute rather than a busy loop on both sides. A new version is applied
// at once; a fixed config arrives within nackRepeatMax.
const (
	nackRepeatMin = time.Second
	nackRepeatMax = 10 * time.Second
)

// The keepalive defaults: a hung server is noticed within 20 s.
const (
	DefaultKeepaliveTime    = 10 * time.Second
	DefaultKeepaliveTimeout = 10 * time.Second
)

// New checks opts and returns a Client.
func New(opts Options) (*Client, error) {
	if opts.Server == "" || opts.NodeID == "" || opts.Update == nil {
		return nil, errors.New("xds: Server, NodeID and Update are required")
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 500 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 30 * time.Second
	}
	opts.MaxBackoff = max(opts.MaxBackoff, opts.MinBackoff)
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.KeepaliveTime <= 0 {
		opts.KeepaliveTime = DefaultKeepaliveTime
	}
	if opts.KeepaliveTimeout <= 0 {
		opts.KeepaliveTimeout = DefaultKeepaliveTimeout
	}
	opts.Limits = opts.Limits.withDefaults(opts.MaxRecvBytes)
	node := &corev3.Node{
		Id:                   opts.NodeID,
		UserAgentName:        "rls",
		UserAgentVersionType: &corev3.Node_UserAgentVersion{UserAgentVersion: opts.Version},
	}
	if len(opts.NodeMetadata) > 0 {
		node.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{}}
		for k, v := range opts.NodeMetadata {
			node.Metadata.Fields[k] = structpb.NewStringValue(v)
		}
	}
	return &Client{opts: opts, node: node, nackLog: logthrottle.New(logthrottle.Every, nil)}, nil
}

// dialOptions are the gRPC channel's: TLS or plaintext, the response bound,
// keepalive, and reconnection backoff within the client's own bounds
// (gRPC's default grows to 2 minutes).
func (c *Client) dialOptions() []grpc.DialOption {
	creds := insecure.NewCredentials()
	if c.opts.TLS != nil {
		creds = credentials.NewTLS(c.opts.TLS)
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithUserAgent("rls/" + c.opts.Version),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: c.opts.MinBackoff, Multiplier: 1.6, Jitter: 0.2, MaxDelay: c.opts.MaxBackoff},
			MinConnectTimeout: 5 * time.Second,
		}),
		// Pings only while a stream is open: between two streams there
		// is nothing to watch, and a server that enforces
		// PermitWithoutStream=false would count them against rls.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: c.opts.KeepaliveTime, Timeout: c.opts.KeepaliveTimeout}),
	}
	if c.opts.MaxRecvBytes > 0 {
		opts = append(opts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(c.opts.MaxRecvBytes)))
	}
	return opts
}

// Run keeps a stream open until ctx ends: on every failure it waits (see
// Options.MinBackoff) and opens a new one. It returns an error only when
// the server address cannot be used at all.
func (c *Client) Run(ctx context.Context) error {
	conn, err := grpc.NewClient(c.opts.Server, c.dialOptions()...)
	if err != nil {
		return fmt.Errorf("xds: %w", err)
	}
	defer conn.Close()
	ads := discoveryv3.NewAggregatedDiscoveryServiceClient(conn)
	c.opts.Log.Info("xds: connecting", "server", c.opts.Server, "node_id", c.opts.NodeID, "type", TypeURL)
	var (
		wait       = c.opts.MinBackoff
		failures   int       // attempts since the last healthy stream
		lastLog    time.Time // of a failure
		suppressed int
	)
	for {
		healthy, err := c.stream(ctx, ads)
		if ctx.Err() != nil {
			return nil
		}
		c.hintPings(err)
		if healthy {
			wait, failures = c.opts.MinBackoff, 0
		}
		failures++
		d := wait/2 + rand.N(wait/2+1) // jittered: replicas do not come back in step
		wait = min(2*wait, c.opts.MaxBackoff)
		// Logged when a healthy stream ends, then at most every 30 s while
		// the server cannot be reached.
		if healthy || time.Since(lastLog) >= 30*time.Second {
			c.opts.Log.Warn("xds: stream to the management server failed; retrying, the config in force (if any) stays",
				"server", c.opts.Server, "err", err, "retry_in", d.Round(time.Millisecond), "attempts", failures, "not_logged", suppressed)
			lastLog, suppressed = time.Now(), 0
		} else {
			suppressed++
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(d):
		}
	}
}

// hintPings says once, when the server closed the connection for
// rls's keepalive pings, what to change on the server.
func (c *Client) hintPings(err error) {
	if err == nil || !strings.Contains(err.Error(), "too_many_pings") {
		return
	}
	c.pingsOnce.Do(func() {
		c.opts.Log.Warn("xds: the management server refuses rls's keepalive pings (too_many_pings) and closed the connection; gRPC doubles the ping interval for it, so a hung server is noticed later. Let the server accept a ping every "+c.opts.KeepaliveTime.String()+
			" (grpc-go: keepalive.EnforcementPolicy{MinTime: "+(c.opts.KeepaliveTime/2).String()+", PermitWithoutStream: true}, a margin for jitter)", "server", c.opts.Server)
	})
}

// stream runs one ADS stream until it fails. healthy reports whether the
// server sent any response on it, or kept it open for MaxBackoff (a server
// with no snapshot for rls's node sends nothing): the backoff starts over.
func (c *Client) stream(ctx context.Context, ads discoveryv3.AggregatedDiscoveryServiceClient) (healthy bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c.attempts.Add(1)
	st, err := ads.StreamAggregatedResources(sctx)
	if err != nil {
		return false, err
	}
	// The first request of a stream asks for everything (a wildcard) and
	// names no version: a control plane that restarted (Envoy Gateway
	// counts versions from 1 again) may reuse the version last accepted
	// for other content, and would then not send it.
	if err := st.Send(c.request("", "", nil)); err != nil {
		return false, recvErr(st, err)
	}
	c.mu.Lock()
	c.rejected.key, c.rejected.err = "", nil
	c.mu.Unlock()
	if c.opts.Connected != nil {
		c.opts.Connected(true)
		defer c.opts.Connected(false)
	}
	c.opts.Log.Info("xds: stream open", "server", c.opts.Server)
	opened := time.Now()
	got := false
	defer func() { healthy = got || time.Since(opened) >= c.opts.MaxBackoff }()
	for {
		resp, err := st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("the server closed the stream")
			}
			return got, err
		}
		got = true
		if resp.GetTypeUrl() != TypeURL {
			// Not subscribed to: answer nothing, as Envoy does for a type
			// it does not know.
			c.opts.Log.Warn("xds: ignoring a response of a type rls did not ask for", "type", resp.GetTypeUrl())
			continue
		}
		req, wait := c.answer(resp)
		if wait > 0 {
			select {
			case <-sctx.Done():
				return got, sctx.Err()
			case <-time.After(wait):
			}
		}
		if err := st.Send(req); err != nil {
			return got, recvErr(st, err)
		}
	}
}

// answer applies resp and returns its ACK (version_info: resp's) or NACK
// (version_info: the last ACKed, error_detail: why), both with resp's
// nonce, and how long to wait before sending it: 0, except for a repetition
// of the response last NACKed (same version, same resources), which is not
// applied again.
func (c *Client) answer(resp *discoveryv3.DiscoveryResponse) (*discoveryv3.DiscoveryRequest, time.Duration) {
	version, nonce := resp.GetVersionInfo(), resp.GetNonce()
	res, err := decode(resp, c.opts.Limits)
	key := responseKey(version, res, resp)
	c.mu.Lock()
	if c.rejected.err != nil && c.rejected.key == key {
		r := &c.rejected
		r.wait = min(max(2*r.wait, nackRepeatMin), nackRepeatMax)
		c.opts.Log.Debug("xds: the rejected config again; NACKing it again", "version", version, "nonce", nonce, "after", r.wait)
		defer c.mu.Unlock()
		return c.nack(nonce, r.err), r.wait
	}
	c.mu.Unlock()

	if err == nil {
		err = c.opts.Update(version, res)
	} else if c.opts.Rejected != nil {
		c.opts.Rejected(version, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		if held, ok := c.nackLog.Allow(); ok {
			c.opts.Log.Error("xds: config rejected (NACK); keeping the last good config",
				"version", version, "nonce", nonce, "last_accepted", c.accepted, "errors", errorCount(err),
				"error", describe(err, maxLogErrors, maxLogErrorBytes), "nacks_not_logged", held)
		}
		c.rejected.key, c.rejected.err, c.rejected.wait = key, err, 0
		return c.nack(nonce, err), 0
	}
	c.rejected.key, c.rejected.err = "", nil
	c.accepted = version
	c.opts.Log.Debug("xds: ACK", "version", version, "nonce", nonce)
	return c.request(version, nonce, nil), 0
}

// nack is the NACK of the response with nonce: version_info is the last
// version ACKed. c.mu is held.
func (c *Client) nack(nonce string, err error) *discoveryv3.DiscoveryRequest {
	return c.request(c.accepted, nonce, &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: truncate(describe(err, maxDetailErrors, maxDetail), maxDetail)})
}

// responseKey identifies a response's content: its version and its
// resources in any order (go-control-plane sends a snapshot's in map
// order), each marshalled deterministically (a server may not: metadata is
// a map). res is resp's decoded resources, nil when they do not decode.
func responseKey(version string, res []*rlsconf.RateLimitConfig, resp *discoveryv3.DiscoveryResponse) string {
	var sums []string
	sum := func(parts ...[]byte) {
		h := sha256.New()
		for _, p := range parts {
			fmt.Fprintf(h, "%d\x00", len(p))
			h.Write(p)
		}
		sums = append(sums, string(h.Sum(nil)))
	}
	if res != nil {
		for _, r := range res {
			b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(r)
			sum(b)
		}
	} else {
		for _, a := range resp.GetResources() {
			sum([]byte(a.GetTypeUrl()), a.GetValue())
		}
	}
	sort.Strings(sums)
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%d\x00", version, len(sums))
	for _, s := range sums {
		h.Write([]byte(s))
	}
	return string(h.Sum(nil))
}

// A response with thousands of bad descriptors is described by its first
// errors: maxDetail bytes and maxDetailErrors errors in the NACK,
// maxLogErrors errors of maxLogErrorBytes each in the log line.
const (
	maxDetail        = 8 << 10
	maxDetailErrors  = 100
	maxLogErrors     = 5
	maxLogErrorBytes = 512
)

// truncate cuts s to at most n bytes, at a rune boundary (a NACK's message
// is a protobuf string: UTF-8), and says how much it left out.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("... (%d more bytes)", len(s)-cut)
}

// describe renders err, bounded: its first maxErrors errors (a
// descriptors.Errors holds one per problem), one per line, each cut at
// maxEach bytes, then how many it left out. It never renders the errors
// it leaves out.
func describe(err error, maxErrors, maxEach int) string {
	var list descriptors.Errors
	if !errors.As(err, &list) || len(list) == 0 {
		return truncate(err.Error(), maxEach)
	}
	var b strings.Builder
	for i, e := range list {
		if i == maxErrors {
			fmt.Fprintf(&b, "\n... and %d more errors", len(list)-i)
			break
		}
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(truncate(e.Error(), maxEach))
	}
	return b.String()
}

// errorCount is the number of errors err holds.
func errorCount(err error) int {
	var list descriptors.Errors
	if errors.As(err, &list) && len(list) > 0 {
		return len(list)
	}
	return 1
}

func (c *Client) request(version, nonce string, detail *rpcstatus.Status) *discoveryv3.DiscoveryRequest {
	return &discoveryv3.DiscoveryRequest{
		Node:          c.node,
		TypeUrl:       TypeURL,
		VersionInfo:   version,
		ResponseNonce: nonce,
		ErrorDetail:   detail,
	}
}

// decode unpacks a response's resources, in name order, once their bytes
// are within lim.
func decode(resp *discoveryv3.DiscoveryResponse, lim Limits) ([]*rlsconf.RateLimitConfig, error) {
	for i, a := range resp.GetResources() {
		if a.GetTypeUrl() != TypeURL {
			return nil, fmt.Errorf("resource %d is a %s, want %s", i, truncate(a.GetTypeUrl(), maxNameInError), TypeURL)
		}
	}
	if err := checkResources(resp.GetResources(), lim); err != nil {
		return nil, err
	}
	out := make([]*rlsconf.RateLimitConfig, 0, len(resp.GetResources()))
	for i, a := range resp.GetResources() {
		c := &rlsconf.RateLimitConfig{}
		if err := a.UnmarshalTo(c); err != nil {
			return nil, fmt.Errorf("resource %d: %w", i, err)
		}
		out = append(out, c)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].GetName() < out[j].GetName() })
	return out, nil
}

// recvErr is the stream's own error after Send failed with io.EOF (the
// stream ended; Recv says why).
func recvErr(st grpc.BidiStreamingClient[discoveryv3.DiscoveryRequest, discoveryv3.DiscoveryResponse], err error) error {
	if !errors.Is(err, io.EOF) {
		return err
	}
	for {
		if _, rerr := st.Recv(); rerr != nil {
			if errors.Is(rerr, io.EOF) {
				return errors.New("the server closed the stream")
			}
			if s, ok := status.FromError(rerr); ok {
				return s.Err()
			}
			return rerr
		}
	}
}
