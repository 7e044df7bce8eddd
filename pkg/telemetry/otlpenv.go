package telemetry

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// The OpenTelemetry variables rls reads itself. The exporter and the SDK
// read the others (headers, certificates, timeout, compression, the
// sampler, the batch delays, the service name and resource attributes)
// themselves.
const (
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	EnvProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvMaxQueueSize   = "OTEL_BSP_MAX_QUEUE_SIZE"
	EnvSDKDisabled    = "OTEL_SDK_DISABLED"
)

// The OTLP protocols rls exports with (OpenTelemetry's names).
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http/protobuf"
)

// OTLPEnv holds the variables rls reads itself, as read ("" when unset).
type OTLPEnv struct {
	TracesEndpoint, Endpoint  string
	TracesProtocol, Protocol  string
	MaxQueueSize, SDKDisabled string
}

// ReadOTLPEnv reads the variables with getenv.
func ReadOTLPEnv(getenv func(string) string) OTLPEnv {
	return OTLPEnv{
		TracesEndpoint: getenv(EnvTracesEndpoint), Endpoint: getenv(EnvEndpoint),
		TracesProtocol: getenv(EnvTracesProtocol), Protocol: getenv(EnvProtocol),
		MaxQueueSize: getenv(EnvMaxQueueSize), SDKDisabled: getenv(EnvSDKDisabled),
	}
}

// OTLPSettings is the tracing the variables ask for.
type OTLPSettings struct {
	// On: an endpoint is set and OTEL_SDK_DISABLED is not true.
	On bool
	// Disabled: OTEL_SDK_DISABLED is true.
	Disabled bool
	// Endpoint is the URL the exporter sends to: for OTLP/HTTP the whole
	// URL of the traces path; "" without an endpoint variable.
	Endpoint string
	// EndpointVar names the variable Endpoint comes from.
	EndpointVar string
	// Protocol is ProtocolGRPC or ProtocolHTTP.
	Protocol string
	// QueueSize is the most spans waiting for export.
	QueueSize int
}

// Settings checks the variables, each set or not, and returns the tracing
// they ask for, or every bad value as an error naming its variable (never
// a URL's credentials). OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is the traces
// URL itself (an empty path is /v1/traces for OTLP/HTTP);
// OTEL_EXPORTER_OTLP_ENDPOINT is a base URL, to which OTLP/HTTP appends
// /v1/traces. The *_TRACES_* variable wins over its general twin. The
// protocol defaults to grpc and the queue to the SDK's 2048 spans.
func (e OTLPEnv) Settings() (OTLPSettings, error) {
	s := OTLPSettings{Protocol: ProtocolGRPC, QueueSize: sdktrace.DefaultMaxQueueSize}
	var errs []error
	for _, v := range [][2]string{{EnvTracesProtocol, e.TracesProtocol}, {EnvProtocol, e.Protocol}} {
		if v[1] != "" && v[1] != ProtocolGRPC && v[1] != ProtocolHTTP {
			errs = append(errs, fmt.Errorf("%s %q is invalid; choices are [%s %s]", v[0], v[1], ProtocolGRPC, ProtocolHTTP))
		}
	}
	if _, p := firstSet(EnvTracesProtocol, e.TracesProtocol, EnvProtocol, e.Protocol); p != "" {
		s.Protocol = p
	}
	for _, v := range [][2]string{{EnvTracesEndpoint, e.TracesEndpoint}, {EnvEndpoint, e.Endpoint}} {
		if _, err := endpointURL(v[1]); v[1] != "" && err != nil {
			errs = append(errs, fmt.Errorf("%s %w", v[0], err))
		}
	}
	var err error
	if s.QueueSize, err = e.queueSize(); err != nil {
		errs = append(errs, err)
	}
	if s.Disabled, err = e.disabled(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return OTLPSettings{}, err
	}
	s.EndpointVar, s.Endpoint = e.endpoint(s.Protocol)
	s.On = s.Endpoint != "" && !s.Disabled
	return s, nil
}

// queueSize is OTEL_BSP_MAX_QUEUE_SIZE, else the SDK's default.
func (e OTLPEnv) queueSize() (int, error) {
	if e.MaxQueueSize == "" {
		return sdktrace.DefaultMaxQueueSize, nil
	}
	n, err := strconv.Atoi(e.MaxQueueSize)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%s %q is invalid: want a whole number of spans, at least 1", EnvMaxQueueSize, e.MaxQueueSize)
	}
	return n, nil
}

// disabled is OTEL_SDK_DISABLED, false when unset.
func (e OTLPEnv) disabled() (bool, error) {
	if e.SDKDisabled == "" {
		return false, nil
	}
	v, err := strconv.ParseBool(e.SDKDisabled)
	if err != nil {
		return false, fmt.Errorf("%s %q is invalid: want true or false", EnvSDKDisabled, e.SDKDisabled)
	}
	return v, nil
}

// endpoint returns the exporter's URL for protocol and its variable; the
// variables are valid.
func (e OTLPEnv) endpoint(protocol string) (name, endpoint string) {
	name, raw := firstSet(EnvTracesEndpoint, e.TracesEndpoint, EnvEndpoint, e.Endpoint)
	if raw == "" {
		return "", ""
	}
	u, _ := endpointURL(raw)
	if protocol == ProtocolHTTP {
		switch {
		case name == EnvEndpoint:
			u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
		case u.Path == "" || u.Path == "/":
			u.Path = "/v1/traces"
		}
	}
	return name, u.String()
}

// firstSet returns the first (name, value) pair with a value.
func firstSet(pairs ...string) (name, value string) {
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i+1] != "" {
			return pairs[i], pairs[i+1]
		}
	}
	return "", ""
}

// endpointURL checks an OTLP endpoint: an http:// (plaintext) or https://
// (TLS) URL with a host, without credentials (they would be logged and
// sent in clear: headers belong in OTEL_EXPORTER_OTLP_HEADERS), query or
// fragment. Its error starts with the value, redacted.
func endpointURL(v string) (*url.URL, error) {
	const want = "want an http:// or https:// URL such as http://collector:4317"
	u, err := url.Parse(v)
	if err != nil {
		return nil, fmt.Errorf("is invalid: %s", want)
	}
	switch {
	case u.User != nil:
		return nil, fmt.Errorf("%s holds credentials: put headers such as Authorization in OTEL_EXPORTER_OTLP_HEADERS", u.Redacted())
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("%q is invalid: %s", v, want)
	case u.Hostname() == "" || (u.Port() != "" && !validPort(u.Port())):
		return nil, fmt.Errorf("%q is invalid: no host or a bad port; %s", v, want)
	case u.RawQuery != "" || u.Fragment != "":
		return nil, fmt.Errorf("%q is invalid: a query or fragment; %s", v, want)
	}
	return u, nil
}

func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n > 0 && n <= 65535
}
