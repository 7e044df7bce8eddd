// Package jsonapi serves envoyproxy/ratelimit's /json endpoint: a
// RateLimitRequest as JSON (protojson) in an HTTP POST, its
// RateLimitResponse as JSON back, 429 when over the limit. It calls the same
// service as gRPC, so the same request bounds apply, and it bounds the body
// as gRPC bounds a message. What a body may cost is bounded before it is
// decoded: at most MaxInFlight bodies at once (more are 503 at once), each
// read within ReadTimeout, and walked for its number of JSON objects and
// arrays and their depth before protojson builds anything (1 MiB of "{}"
// made 43 MB of descriptors; 16 such bodies at once took 1.08 GB).
package jsonapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rls-project/rls/pkg/logthrottle"
)

// Options configure the handler.
type Options struct {
	// MaxBytes bounds the request body [1 MiB, gRPC's message bound].
	MaxBytes int64
	// Timeout bounds one decision, as a gRPC caller's deadline would [1s].
	Timeout time.Duration
	// MaxInFlight bounds the requests handled at once; one more is
	// answered 503 at once, and its connection closed [16].
	MaxInFlight int
	// ReadTimeout bounds the reading of a body: one sent slower is 408
	// [5s].
	ReadTimeout time.Duration
	Log         *slog.Logger
}

// Bounds of a body's JSON walked before it is decoded: a request within
// the service's bounds (64 descriptors of 32 entries, each descriptor with
// its entries array and a limit) has about 2,300 objects and arrays,
// nested 5 deep.
const (
	maxContainers = 4096
	maxDepth      = 16
)

// Handler returns the /json handler deciding through svc.
func Handler(svc rlsv3.RateLimitServiceServer, o Options) http.Handler {
	o.defaults()
	return &handler{svc: svc, o: o, th: logthrottle.New(logthrottle.Every, nil), slots: make(chan struct{}, o.MaxInFlight)}
}

func (o *Options) defaults() {
	if o.MaxBytes <= 0 {
		o.MaxBytes = 1 << 20
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 16
	}
	if o.ReadTimeout <= 0 {
		o.ReadTimeout = 5 * time.Second
	}
}

// handler is the /json handler: at most MaxInFlight requests at once.
type handler struct {
	svc   rlsv3.RateLimitServiceServer
	o     Options
	th    *logthrottle.Throttle
	slots chan struct{}
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	o := &h.o
	rc := http.NewResponseController(w)
	select {
	case h.slots <- struct{}{}:
		defer func() { <-h.slots }()
	default:
		// Not a byte more of this body: the connection is closed.
		_ = rc.SetReadDeadline(time.Now())
		w.Header().Set("Connection", "close")
		http.Error(w, "too many /json requests in flight (the most is "+strconv.Itoa(o.MaxInFlight)+"): retry later", http.StatusServiceUnavailable)
		return
	}
	_ = rc.SetReadDeadline(time.Now().Add(o.ReadTimeout))
	req, ok := h.request(w, r)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), o.Timeout)
	defer cancel()
	resp, err := h.svc.ShouldRateLimit(ctx, req)
	if err != nil {
		code := httpCode(status.Code(err))
		if code >= 500 {
			if held, ok := h.th.Allow(); ok {
				o.Log.Warn("/json: decision failed", "err", err, "not_logged_since", held)
			}
		}
		http.Error(w, status.Convert(err).Message(), code)
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		http.Error(w, "encoding the response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	_, _ = w.Write(out)
}

// request reads and decodes r's body within the bounds; false when it
// answered an error.
func (h *handler) request(w http.ResponseWriter, r *http.Request) (*rlsv3.RateLimitRequest, bool) {
	o := &h.o
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, o.MaxBytes))
	var tooBig *http.MaxBytesError
	var ne net.Error
	switch {
	case errors.As(err, &tooBig):
		http.Error(w, "request body over the limit of "+strconv.FormatInt(o.MaxBytes, 10)+" bytes", http.StatusRequestEntityTooLarge)
		return nil, false
	case errors.As(err, &ne) && ne.Timeout():
		w.Header().Set("Connection", "close")
		http.Error(w, "request body not read within "+o.ReadTimeout.String(), http.StatusRequestTimeout)
		return nil, false
	case err != nil:
		http.Error(w, "reading the request: "+err.Error(), http.StatusBadRequest)
		return nil, false
	}
	if err := walk(body); err != nil {
		http.Error(w, "not a RateLimitRequest within rls's bounds: "+err.Error(), http.StatusBadRequest)
		return nil, false
	}
	var req rlsv3.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		http.Error(w, "not a RateLimitRequest in JSON: "+err.Error(), http.StatusBadRequest)
		return nil, false
	}
	return &req, true
}

// httpCode maps the service's gRPC codes to HTTP statuses.
func httpCode(c codes.Code) int {
	switch c {
	case codes.InvalidArgument:
		return http.StatusBadRequest
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded, codes.Canceled:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// walk counts b's JSON objects and arrays and their depth, outside
// strings, without decoding anything, and reports the first bound passed.
// It does not check the syntax: protojson does, within the bounds.
func walk(b []byte) error {
	containers, depth := 0, 0
	inString, escaped := false, false
	for _, c := range b {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			containers++
			depth++
			if containers > maxContainers {
				return fmt.Errorf("more than %d JSON objects and arrays", maxContainers)
			}
			if depth > maxDepth {
				return fmt.Errorf("JSON nested more than %d deep", maxDepth)
			}
		case c == '}' || c == ']':
			depth--
		}
	}
	return nil
}
