// Package jsonapi serves envoyproxy/ratelimit's /json endpoint: a
// RateLimitRequest as JSON (protojson) in an HTTP POST, its
// RateLimitResponse as JSON back, 429 when over the limit. It calls the same
// service as gRPC, so the same request bounds apply, and it bounds the body
// as gRPC bounds a message.
package jsonapi

import (
	"context"
	"errors"
	"io"
	"log/slog"
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
	Log     *slog.Logger
}

// Handler returns the /json handler deciding through svc.
func Handler(svc rlsv3.RateLimitServiceServer, o Options) http.Handler {
	if o.MaxBytes <= 0 {
		o.MaxBytes = 1 << 20
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	th := logthrottle.New(logthrottle.Every, nil)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, o.MaxBytes))
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			http.Error(w, "request body over the limit of "+strconv.FormatInt(o.MaxBytes, 10)+" bytes", http.StatusRequestEntityTooLarge)
			return
		case err != nil:
			http.Error(w, "reading the request: "+err.Error(), http.StatusBadRequest)
			return
		}
		var req rlsv3.RateLimitRequest
		if err := protojson.Unmarshal(body, &req); err != nil {
			http.Error(w, "not a RateLimitRequest in JSON: "+err.Error(), http.StatusBadRequest)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), o.Timeout)
		defer cancel()
		resp, err := svc.ShouldRateLimit(ctx, &req)
		if err != nil {
			code := httpCode(status.Code(err))
			if code >= 500 {
				if held, ok := th.Allow(); ok {
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
	})
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
