// Package telemetry is what rls reports about itself besides the decision
// metrics of pkg/service: the store decorators that time its calls
// (MeteredStore) and trace them (Tracing.Store), the OTLP trace exporter
// and its bounded span queue (NewTracing, configured from OpenTelemetry's
// variables by ReadOTLPEnv), and the Prometheus collectors of the
// limiter's tables, the fleet size, the Redis breakers and the config in
// force. The registry is made by the caller; nothing here registers
// globally, except OpenTelemetry's logger and error handler while tracing
// is on.
package telemetry
